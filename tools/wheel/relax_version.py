"""Drops one symbol-version requirement from a shared library that no longer
uses it (tools/build_wheel.sh, after `patchelf --clear-symbol-version`):

    relax_version.py LIB VERSION KEEP

The entry that required VERSION (e.g. GLIBCXX_3.4.30) is pointed at KEEP, a
version the library already requires from the same file (e.g.
GLIBCXX_3.4.20): the loader then asks only for versions it asked for before,
and the symbol whose version was cleared binds to the default definition of
whichever library the node has. Refuses when a symbol still uses VERSION's
index, or when KEEP is not required already."""
import struct
import sys

from elftools.elf.elffile import ELFFile


def elf_hash(name):
    h = 0
    for c in name.encode():
        h = ((h << 4) + c) & 0xFFFFFFFF
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g & 0xFFFFFFFF
    return h


def main(path, version, keep):
    with open(path, "rb") as f:
        elf = ELFFile(f)
        verneed = elf.get_section_by_name(".gnu.version_r")
        versym = elf.get_section_by_name(".gnu.version")
        dynstr = elf.get_section_by_name(".dynstr")
        target = kept = None
        offset = verneed["sh_offset"]
        for vn, auxes in verneed.iter_versions():
            aux_offset = offset + vn["vn_aux"]
            for aux in auxes:
                if aux.name == version:
                    target = (aux_offset, aux["vna_other"])
                if aux.name == keep:
                    kept = aux["vna_name"]
                aux_offset += aux["vna_next"]
            offset += vn["vn_next"]
        if target is None:
            print(f"relax_version: {path} does not require {version}")
            return 0
        if kept is None:
            sys.exit(f"relax_version: {path} does not require {keep} already")
        used = [s.name for s, v in zip(elf.get_section_by_name(".dynsym").iter_symbols(), versym.iter_symbols())
                if v["ndx"] == target[1]]
        if used:
            sys.exit(f"relax_version: {path}: symbols still use {version}: {used[:5]}")
        del dynstr
    with open(path, "r+b") as f:
        # Elf64_Vernaux: vna_hash (4), vna_flags (2), vna_other (2), vna_name (4), vna_next (4).
        f.seek(target[0])
        f.write(struct.pack("<I", elf_hash(keep)))
        f.seek(target[0] + 8)
        f.write(struct.pack("<I", kept))
    print(f"relax_version: {path}: {version} -> {keep}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
