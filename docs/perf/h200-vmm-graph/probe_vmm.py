import ctypes, os, sys
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "conf", os.environ["PYTORCH_CUDA_ALLOC_CONF"])
cu = ctypes.CDLL("libcuda.so.1")
u64 = ctypes.c_uint64
def chk(name, r):
    if r != 0:
        s = ctypes.c_char_p(); cu.cuGetErrorName(r, ctypes.byref(s)); return f"{name}->{s.value.decode()}"
    return None
torch.cuda.init(); x = torch.empty(1, device="cuda")
def info(p):
    base = u64(); size = ctypes.c_size_t()
    e = chk("range", cu.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), u64(p)))
    h = u64()
    e2 = chk("retain", cu.cuMemRetainAllocationHandle(ctypes.byref(h), ctypes.c_void_p(p)))
    prop = (ctypes.c_int * 16)()
    ht = None
    if not e2:
        e3 = chk("props", cu.cuMemGetAllocationPropertiesFromHandle(prop, h))
        ht = (prop[0], prop[1], prop[2], prop[3], e3)
        fd = ctypes.c_int(-1)
        e4 = chk("export", cu.cuMemExportToShareableHandle(ctypes.byref(fd), h, 1, u64(0)))
        ht = ht + (e4, fd.value)
        if fd.value >= 0: os.close(fd.value)
        cu.cuMemRelease(h)
    a = {}
    for nm, code in (("bufid",7),("memtype",2),("legacy",10),("allowed",14),("mapsize",18),("mapbase",19),("pool",17)):
        v = ctypes.c_uint64(0)
        er = chk("attr", cu.cuPointerGetAttribute(ctypes.byref(v), code, u64(p)))
        a[nm] = er or hex(v.value)
    return dict(ptr=hex(p), base=hex(base.value), size=size.value, err=e, retain=e2, props=ht, attrs=a)
ts = []
for n in [1<<10, 1<<20, 5<<20, 30<<20, 100<<20, 300<<20]:
    t = torch.empty(n, dtype=torch.uint8, device="cuda"); ts.append(t)
    print(n, info(t.data_ptr()))
# walk chunks of the largest
t = ts[-1]; p = t.data_ptr(); end = p + t.numel(); chunks = []
while p < end:
    base = u64(); size = ctypes.c_size_t()
    cu.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), u64(p)); chunks.append((hex(base.value), size.value)); p = base.value + size.value
print("chunks of 300MiB tensor:", len(chunks), chunks[:4])
p0 = ts[-1].data_ptr(); print("before free", info(p0)); del ts, t; torch.cuda.empty_cache()
print("after empty_cache at old ptr", info(p0))
t2 = torch.empty(300<<20, dtype=torch.uint8, device="cuda"); print("realloc", info(t2.data_ptr()), "same ptr", t2.data_ptr()==p0)
# cudaMallocAsync default pool
cudart = ctypes.CDLL(None)
try:
    rt = ctypes.CDLL("libcudart.so.13")
except OSError:
    import glob; c = glob.glob(os.path.dirname(torch.__file__)+"/../nvidia/*/lib/libcudart.so*"); print(c); rt = ctypes.CDLL(c[0]) if c else None
if rt:
    p = ctypes.c_void_p()
    print("mallocAsync", rt.cudaMallocAsync(ctypes.byref(p), 1<<20, None), rt.cudaStreamSynchronize(None))
    print("async ptr", info(p.value))
    print("cu version", end=" "); v=ctypes.c_int(); cu.cuDriverGetVersion(ctypes.byref(v)); print(v.value)
