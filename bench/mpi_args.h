// The command line of the Open MPI benchmarks (mpi_allgather,
// mpi_reduce_scatter): --name=value flags, read before MPI_Init's own
// arguments are of any concern (mpirun passes ours through).
#pragma once

#include <cstring>
#include <string>
#include <vector>

namespace dmagather::bench {

// "1,16,64" -> {1, 16, 64}.
inline std::vector<size_t> ParseSizes(const char* s) {
  std::vector<size_t> out;
  const std::string str(s);
  size_t pos = 0;
  while (pos < str.size()) {
    size_t end = str.find(',', pos);
    if (end == std::string::npos) end = str.size();
    out.push_back(std::stoul(str.substr(pos, end - pos)));
    pos = end + 1;
  }
  return out;
}

// The value of --name=value, or `dflt`.
inline const char* Arg(int argc, char** argv, const char* name, const char* dflt) {
  const size_t n = std::strlen(name);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], name, n) == 0 && argv[i][n] == '=') return argv[i] + n + 1;
  }
  return dflt;
}

}  // namespace dmagather::bench
