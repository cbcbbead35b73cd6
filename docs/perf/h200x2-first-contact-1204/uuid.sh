#!/bin/bash
# Ranks that each see one GPU by UUID (in the reverse of the daemon's order),
# the daemon seeing both by index: bit-exact, and the mapping it logs.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader
u=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | tr -d ' ' | tac | paste -sd, -)
echo "rank r sees only entry r % 2 of: $u"
sock=/tmp/u.sock
./bin/dmagatherd --socket=$sock --backend=cuda --socket_mode=0666 --metrics_listen= >$OUT/uuid.daemon.log 2>&1 &
dp=$!
for _ in $(seq 1 200); do [ -S $sock ] && break; sleep 0.1; done
pass=0; fail=0
for m in dtypes coalesced vmm suballoc; do
  if DMAGATHER_SOCKET=$sock DMAGATHER_TEST_RANK_VISIBLE=$u timeout 60 ./bin/allgather_gpu_test $m >$OUT/uuid.$m.log 2>&1; then pass=$((pass+1)); r=PASS; else fail=$((fail+1)); r=FAIL; fi
  echo "$m: $r $(grep -v '^PASS\|^FAIL' $OUT/uuid.$m.log | tail -n 1)"
done
./bin/dmagatherctl --socket=$sock stats | tail -n 3
kill -TERM $dp; wait $dp
grep "is dmagatherd's device" $OUT/uuid.daemon.log | sed 's/.*\] //' | sort | uniq -c
grep "cuda engine:" $OUT/uuid.daemon.log | sed 's/.*\] //' | cut -c1-400
echo "uuid visibility: $pass passed, $fail failed"
