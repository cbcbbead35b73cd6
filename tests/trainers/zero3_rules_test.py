"""The ZeRO-3 zero-copy fetch's rules and handle (dmagather/_zero3_zero_copy.py)
on one stage: DeepSpeed's real ZeRO-3 module (for ZeroParamStatus and
get_allgather_dtype), fake parameters and a fake adapter. What runs end to end
is in zero3_test.py; here every rule is taken once, and the handle's wait()
builds each parameter from its gathered buffer."""
import collections
import types
import unittest

try:
    import torch
    from deepspeed.runtime.zero import partition_parameters as pp
    from dmagather import _zero3_zero_copy as z3
    HAVE_DS, WHY = True, ""
except Exception as e:  # noqa: BLE001
    HAVE_DS, WHY = False, f"deepspeed is not importable in this venv: {e}"


class FakeAdapter:
    backend = "host"
    host_staging = True

    def __init__(self):
        self.counters = collections.Counter()

    def _is_world(self, group):
        return group == "world"


def param(numel=6, dtype=None, group="world"):
    dtype = dtype or torch.float32
    return types.SimpleNamespace(ds_tensor=torch.zeros(numel, dtype=dtype), ds_secondary_tensor=None,
                                 group=group, dtype=dtype)


def init(**over):
    d = dict(use_all_reduce_for_fetch_params=False, allgather_sequential=False,
             get_partition_dp_group=lambda p: p.group, _partition_world_size=lambda p: 2)
    d.update(over)
    return types.SimpleNamespace(**d)


@unittest.skipUnless(HAVE_DS, WHY)
class Zero3RulesTest(unittest.TestCase):
    def rule(self, params, adapter=None, safe_mode=False, quantize=False, **init_over):
        i = init(**init_over)
        return z3._rule(adapter or FakeAdapter(), i, params, safe_mode, quantize, pp,
                        i.get_partition_dp_group(params[0]), torch.device("cpu"))

    def test_a_plain_fetch_is_taken(self):
        self.assertIsNone(self.rule([param(), param(10)]))

    def test_each_rule(self):
        q = param()
        q.ds_tensor.ds_quant_scale = torch.ones(1)
        self.assertEqual(self.rule([param(), q]), "quantized")
        self.assertEqual(self.rule([param(), param()], quantize=True), "quantized")
        h = param()
        h.ds_secondary_tensor = torch.zeros(3)
        self.assertEqual(self.rule([param(), h]), "hpz")
        self.assertEqual(self.rule([param(), param()], use_all_reduce_for_fetch_params=True), "all_reduce_fetch")
        self.assertEqual(self.rule([param(), param()], safe_mode=True), "safe_mode")
        self.assertEqual(self.rule([param(group="sub"), param(group="sub")]), "group")
        self.assertEqual(self.rule([param(), param(group="sub")]), "group")
        c = param()
        c.comm_dtype = torch.bfloat16  # DeepSpeed's autocast: gathered in another dtype
        self.assertEqual(self.rule([param(), c]), "dtype")
        n = param()
        n.ds_tensor.final_location = types.SimpleNamespace(value="nvme")
        self.assertEqual(self.rule([param(), n]), "offload")
        a = FakeAdapter()
        a.host_staging = False
        self.assertEqual(self.rule([param(), param()], adapter=a), "host_memory")

    def test_handle_builds_each_parameter_from_its_buffer(self):
        st = pp.ZeroParamStatus
        ps = []
        for numel, shape in ((5, (5,)), (6, (2, 3))):  # 5 over 2 ranks: padded to 6
            p = types.SimpleNamespace(ds_numel=numel, ds_shape=torch.Size(shape), ds_status=st.INFLIGHT,
                                      data=None, ds_summary=lambda: "p")
            ps.append(p)
        outs = [torch.arange(6, dtype=torch.float32), torch.arange(6, dtype=torch.float32) + 10]
        h = z3._Handle(None, ps, outs, st)
        h.wait()
        self.assertTrue(torch.equal(ps[0].data, torch.arange(5, dtype=torch.float32)))
        self.assertEqual(ps[1].data.shape, (2, 3))
        self.assertTrue(torch.equal(ps[1].data.reshape(-1), outs[1]))
        self.assertEqual(ps[1].data.data_ptr(), outs[1].data_ptr(), "a view of the gathered buffer, not a copy")
        self.assertTrue(all(p.ds_status == st.AVAILABLE for p in ps))
        h.wait()  # once only
        ps[0].ds_status = st.NOT_AVAILABLE
        with self.assertRaises(RuntimeError):
            z3._Handle(None, ps, outs, st).wait()

    def test_undecorated_finds_the_closure_under_the_nvtx_decorator(self):
        from deepspeed.utils.nvtx import instrument_w_nvtx

        def all_gather_coalesced(params, safe_mode=False, quantize=False):
            return params

        self.assertIs(z3._undecorated(instrument_w_nvtx(all_gather_coalesced)), all_gather_coalesced)


if __name__ == "__main__":
    unittest.main()
