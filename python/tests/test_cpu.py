"""CPU tests of the flashjit package: no GPU needed (on a GPU machine they pass too).

Run through ctest (python_cpu), or by hand:
    FLASHJIT_LIBRARY=build/libflashjit.so FLASHJIT_CLI=build/tools/flashjit \
        PYTHONPATH=python python3 python/tests/run.py python/tests/test_cpu.py
The torch tests skip, saying why, where torch cannot be imported."""

import ctypes
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import flashjit
from flashjit import _capi, _loader, cache

HAVE_TORCH = importlib.util.find_spec("torch") is not None
NO_TORCH = ("torch is not installed here (CI: the CPU wheel's index, download.pytorch.org, is not "
            "reachable, and PyPI's torch pulls GBs of CUDA wheels), so the torch entry points' "
            "CPU tests did not run")
ROOT = Path(__file__).resolve().parents[2]


def has_driver():
    return flashjit.library().driver_version() is not None


DOC_MASK = """__device__ bool mask_mod(int b, int h, int q, int k, const flashjit::UserArgs& a) {
  const int* doc = static_cast<const int*>(a.ptr[0]);
  return doc[q] == doc[k];
}
"""
BIAS = """__device__ float score_mod(float s, int b, int h, int q, int k, const flashjit::UserArgs& a) {
  return s + static_cast<const float*>(a.ptr[1])[h];
}
"""
BIAS_GRAD = """__device__ float score_mod_grad(float s, int b, int h, int q, int k,
                                const flashjit::UserArgs& a) {
  return 1.f;
}
"""


def a_variant(arch="sm_80"):
    """A small real variant name, from the CLI's own default set (simt compiles fastest)."""
    out = cache.run_cli(["precompile", "--arch", arch, "--family", "simt", "--head-dim", "32",
                         "--dtype", "bf16", "--causal", "no", "--dry-run"]).stdout
    names = [word for word in out.split() if word.startswith("simt.")]
    assert names, out
    return names[0]


class ImportAndLibrary(unittest.TestCase):
    def test_import_needs_no_torch(self):
        # A fresh interpreter: importing flashjit must not import torch (nor load the library).
        code = ("import sys, flashjit; assert 'torch' not in sys.modules, 'torch imported'; "
                "assert flashjit._library is None; print(flashjit.__version__)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(os.environ))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), flashjit.__version__)

    def test_library_loads_and_reports(self):
        lib = flashjit.library()
        self.assertIs(lib, flashjit.library())
        self.assertEqual(lib.version(), flashjit.__version__)
        self.assertRegex(lib.nvrtc_version(), r"^\d+\.\d+$")
        self.assertIn("mma", lib.families())
        self.assertTrue(Path(lib.path).is_file())

    def test_tools_shim_is_the_binding(self):
        # tools/flashjit_ctypes.py re-exports this module itself, not a copy.
        code = (f"import sys; sys.path.insert(0, {str(ROOT / 'tools')!r}); "
                "import flashjit_ctypes, flashjit._capi as c; assert flashjit_ctypes is c; "
                "print(flashjit_ctypes.FlashjitForwardOptions.__name__)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)

    @unittest.skipIf(HAVE_TORCH, "torch is installed here: the no-torch message cannot show")
    def test_torch_entry_points_say_torch_is_missing(self):
        with self.assertRaises(flashjit.TorchUnavailableError) as caught:
            flashjit.attention  # noqa: B018
        self.assertIn("PyTorch >= 2.4", str(caught.exception))
        self.assertIn("flashjit.cache", str(caught.exception))
        self.assertIsInstance(caught.exception, ImportError)

    def test_unknown_attribute(self):
        with self.assertRaises(AttributeError):
            flashjit.no_such_thing  # noqa: B018


class Errors(unittest.TestCase):
    def test_status_maps_to_its_class(self):
        for status, cls in _capi.ERROR_CLASSES.items():
            with self.assertRaises(cls) as caught:
                _capi.raise_status("flashjit_x", status, "why")
            self.assertIsInstance(caught.exception, flashjit.FlashjitError)
            self.assertEqual(caught.exception.message, "why")
            self.assertIn(_capi.STATUS_NAMES[status], str(caught.exception))
        self.assertTrue(issubclass(flashjit.InvalidArgumentError, ValueError))

    def test_bad_variant_name_is_invalid_argument_with_the_message(self):
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaises(flashjit.InvalidArgumentError) as caught:
                flashjit.cache.precompile(["mma.sm90a.bf16.d100.m128n64s2"], cache_dir=tmp)
        self.assertIn("has no head_dim 100", caught.exception.message)

    def test_no_driver_is_no_driver_error(self):
        if has_driver():
            self.skipTest("a CUDA driver is here: engine creation does not fail")
        with self.assertRaises(flashjit.NoDriverError) as caught:
            flashjit.library().create_engine(0)
        self.assertIn("driver", caught.exception.message)


class FindingLibraries(unittest.TestCase):
    def test_environment_variable_first(self):
        with mock.patch.dict(os.environ, {"FLASHJIT_LIBRARY": "/nonexistent/libflashjit.so"}):
            with self.assertRaises(flashjit.FlashjitLoadError) as caught:
                _loader.find_library()
        self.assertIn("FLASHJIT_LIBRARY", str(caught.exception))

    def test_bundled_copy_before_the_checkout_and_the_system(self):
        with tempfile.TemporaryDirectory() as tmp:
            bundled = Path(tmp) / _loader.SONAME
            bundled.write_bytes(b"")
            environment = {k: v for k, v in os.environ.items()
                           if k not in ("FLASHJIT_LIBRARY", "FLASHJIT_LIB")}
            with mock.patch.dict(os.environ, environment, clear=True), \
                    mock.patch.object(_loader, "BUNDLED_LIBRARY", bundled):
                self.assertEqual(_loader.find_library(), str(bundled))
            with mock.patch.dict(os.environ, environment, clear=True), \
                    mock.patch.object(_loader, "BUNDLED_LIBRARY", Path(tmp) / "none"), \
                    mock.patch.object(_loader, "CHECKOUT", Path(tmp)), \
                    mock.patch.object(Path, "cwd", return_value=Path(tmp)):
                self.assertEqual(_loader.find_library(), _loader.SONAME)  # the system loader's

    def test_nvrtc_from_the_nvidia_wheel(self):
        with tempfile.TemporaryDirectory() as tmp:
            lib = Path(tmp) / "site" / "nvidia" / "cu13" / "lib"
            lib.mkdir(parents=True)
            (lib / "libnvrtc.so.13").write_bytes(b"")
            found = _loader.locate_dependency("libnvrtc.so.13", Path(tmp) / "elsewhere",
                                              search_path=[Path(tmp) / "site"])
            self.assertEqual(found, lib / "libnvrtc.so.13")
            # Only NVRTC is looked for in the wheels.
            self.assertIsNone(_loader.locate_dependency("libfmt.so.9", Path(tmp) / "elsewhere",
                                                        search_path=[Path(tmp) / "site"]))

    def test_missing_dependency_is_preloaded_then_the_load_retried(self):
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "libfmt.so.9").write_bytes(b"")  # beside the library, as pack puts it
            library = Path(tmp) / "libflashjit.so.0"
            calls = []

            def cdll(path, mode=0):
                calls.append((Path(path).name, mode))
                if Path(path).name == "libflashjit.so.0" and len(calls) == 1:
                    raise OSError("libfmt.so.9: cannot open shared object file: No such file")
                return "handle"

            handle, preloaded = _loader.load_library(library, cdll=cdll, search_path=[])
        self.assertEqual(handle, "handle")
        self.assertEqual([p.name for p in preloaded], ["libfmt.so.9"])
        self.assertEqual(calls, [("libflashjit.so.0", 0), ("libfmt.so.9", ctypes.RTLD_GLOBAL),
                                 ("libflashjit.so.0", 0)])

    def test_unfindable_dependency_names_it(self):
        def cdll(path, mode=0):
            raise OSError("libnvrtc.so.13: cannot open shared object file: No such file")

        with self.assertRaises(flashjit.FlashjitLoadError) as caught:
            _loader.load_library("/x/libflashjit.so.0", cdll=cdll, search_path=[])
        self.assertIn("libnvrtc.so.13", str(caught.exception))
        self.assertIn("nvidia-cuda-nvrtc", str(caught.exception))


class UserFunctionsWithoutGpu(unittest.TestCase):
    def test_hash_is_the_librarys(self):
        functions = flashjit.UserFunctions(mask_mod=DOC_MASK)
        self.assertRegex(functions.hash, r"^[0-9a-f]{32}$")
        self.assertEqual(flashjit.UserFunctions(score_mod="", mask_mod=DOC_MASK).hash,
                         functions.hash)
        self.assertEqual(flashjit.library().user_functions(mask_mod=DOC_MASK).hash,
                         functions.hash)
        self.assertNotEqual(flashjit.UserFunctions(score_mod=DOC_MASK).hash, functions.hash)
        both = flashjit.UserFunctions(BIAS, DOC_MASK)
        self.assertNotIn(both.hash, (functions.hash, flashjit.UserFunctions(BIAS).hash))
        self.assertIn(functions.hash, repr(functions))
        # What the CLI computes from the same source in a file.
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "doc_mask.cu"
            path.write_text(DOC_MASK)
            self.assertEqual(flashjit.UserFunctions.from_files(mask_mod_file=path).hash,
                             functions.hash)
            out = cache.run_cli(["precompile", "--variant", "mma.sm80.bf16.d64.m64n64s1",
                                 "--mask-mod", str(path), "--dry-run"]).stdout
        self.assertEqual(out.strip(), f"mma.sm80.bf16.d64.m64n64s1.user{functions.hash}")

    def test_errors_name_the_argument(self):
        with self.assertRaises(flashjit.InvalidArgumentError) as caught:
            flashjit.UserFunctions()
        self.assertIn("both empty", caught.exception.message)
        with tempfile.TemporaryDirectory() as tmp:
            missing = str(Path(tmp) / "missing.cu")
            with self.assertRaises(flashjit.InvalidArgumentError) as caught:
                flashjit.UserFunctions.from_files(score_mod_file=missing)
        self.assertIn(f"score_mod file {missing}", caught.exception.message)

    def test_precompile_needs_the_functions_in_this_process(self):
        functions = flashjit.UserFunctions(score_mod=BIAS)
        with tempfile.TemporaryDirectory() as tmp:
            name = f"mma.sm80.bf16.d64.m64n64s1.user{functions.hash}"
            cache.precompile([name], cache_dir=tmp)  # the C API: this process knows the hash
            entries = cache.list(cache_dir=tmp)
            self.assertEqual([(e["name"], e["user_functions"]) for e in entries],
                             [(name, functions.hash)])
            with self.assertRaises(flashjit.CompileError) as caught:
                cache.precompile(["mma.sm80.bf16.d64.m64n64s1.user" + "0" * 32], cache_dir=tmp)
        self.assertIn("this process does not know", caught.exception.message)

    def test_options_struct_and_user_args(self):
        options = _capi.FlashjitForwardOptions
        if ctypes.sizeof(ctypes.c_void_p) == 8:  # the C test pins the same size
            self.assertEqual(ctypes.sizeof(options), 176)
        self.assertEqual(options.user_args.offset,
                         options.user_functions.offset + ctypes.sizeof(ctypes.c_void_p))
        self.assertEqual(options.block_mask.offset, options.user_args.offset +
                         _capi.MAX_USER_ARGS * ctypes.sizeof(ctypes.c_void_p))
        self.assertEqual(_capi.user_arg_pointers([0x1000, None]), [0x1000] + [0] * 7)
        with self.assertRaisesRegex(ValueError, "user_args has 9 entries: expected at most 8"):
            _capi.user_arg_pointers([0] * 9)
        with self.assertRaisesRegex(TypeError, r"user_args\[1\] has type str"):
            _capi.user_arg_pointers([0, "x"])


class BackwardWithoutGpu(unittest.TestCase):
    """The C API's backward through the binding: struct layout, families, argument errors."""

    def test_options_struct_has_no_padding(self):
        options = _capi.FlashjitBackwardOptions
        end = 0
        align = ctypes.alignment(options)
        for name, kind in options._fields_:
            if name == "block_mask":  # appended after sink_tokens: padding up to a pointer
                end = (end + align - 1) // align * align
            self.assertEqual(getattr(options, name).offset, end, name)  # each where the last ends
            end += ctypes.sizeof(kind)
        self.assertEqual(options._fields_[-1][0], "block_mask")
        self.assertEqual(ctypes.sizeof(options), end)
        if ctypes.sizeof(ctypes.c_void_p) == 8:  # the C test pins the same size
            self.assertEqual(ctypes.sizeof(options), 176)

    def test_backward_families_are_the_librarys(self):
        import json
        lib = flashjit.library()
        info = json.loads(cache.run_cli(["info", "--json"]).stdout)
        self.assertEqual(list(lib.backward_families()),
                         [f["name"] for f in info["families"] if f["backward"]])
        # Forward's families and backward's are apart.
        self.assertFalse(set(lib.backward_families()) & set(lib.families()))
        self.assertEqual(flashjit.info()["library"]["backward_families"],
                         list(lib.backward_families()))

    def test_null_arguments_are_named(self):
        lib = flashjit.library()
        function = lib.backward_function("flashjit_backward")
        t = _capi.make_tensor(0x100000, "bf16", (1, 64, 2, 64), (8192, 128, 64, 1))
        ref = ctypes.byref
        options = _capi.FlashjitBackwardOptions()
        status = function(None, ref(t), ref(t), ref(t), ref(t), ref(t), None, ref(t), ref(t),
                          ref(t), ref(options), None)
        self.assertEqual(status, _capi.INVALID_ARGUMENT)
        self.assertIn("engine is null", lib.last_error())
        status = function(None, ref(t), ref(t), ref(t), ref(t), None, None, ref(t), ref(t),
                          ref(t), None, None)
        self.assertEqual(status, _capi.INVALID_ARGUMENT)
        self.assertEqual(lib.last_error(), "dout is null: expected a flashjit_tensor")
        size = lib.backward_function("flashjit_backward_workspace_bytes")
        self.assertEqual(size(None, None, ref(t), ref(t), None, None), _capi.INVALID_ARGUMENT)
        self.assertEqual(lib.last_error(), "q is null: expected a flashjit_tensor")

    def test_engine_options(self):
        # Engine.backward_options needs no GPU: an Engine over no handle builds the struct.
        engine = _capi.Engine(flashjit.library(), None)
        o = engine.backward_options(causal=True, softmax_scale=0.5, deterministic=True,
                                    tiles=(64, 128, 2), workspace=0x1000, workspace_bytes=4096)
        self.assertEqual((o.causal, o.softmax_scale, o.deterministic), (1, 0.5, 1))
        self.assertEqual((o.tile_m, o.tile_n, o.stages), (64, 128, 2))
        self.assertEqual((o.workspace, o.workspace_bytes, o.family), (0x1000, 4096, None))
        zeroed = engine.backward_options()
        self.assertEqual(bytes(zeroed), bytes(_capi.FlashjitBackwardOptions()))
        with self.assertRaisesRegex(ValueError, "family 'mma': the backward families of"):
            engine.backward_options(family="mma")
        for family in flashjit.library().backward_families():
            self.assertEqual(engine.backward_options(family=family).family, family.encode())


class VarlenBackwardBinding(unittest.TestCase):
    """flashjit_backward_varlen and friends through the binding: prototypes, argument errors
    (each read before the engine, so no GPU is needed)."""

    def setUp(self):
        self.lib = flashjit.library()
        if not self.lib.has_function("flashjit_backward_varlen"):
            self.skipTest(f"{self.lib.path} predates flashjit_backward_varlen (rebuild it)")
        # Packed views [1, total, heads, head_dim] at made-up addresses: nothing is read.
        self.t = _capi.make_tensor(0x100000, "bf16", (1, 64, 2, 64), (8192, 128, 64, 1))
        self.varlen = _capi.make_varlen(0x200000, 0x200100, 2, 40, 40)
        self.options = _capi.FlashjitBackwardOptions()

    def test_null_arguments_are_named(self):
        lib, ref, t = self.lib, ctypes.byref, self.t
        function = lib.backward_function("flashjit_backward_varlen")
        status = function(None, ref(t), ref(t), ref(t), ref(t), ref(t), None, ref(t), ref(t),
                          ref(t), None, ref(self.options), None)
        self.assertEqual(status, _capi.INVALID_ARGUMENT)
        self.assertEqual(lib.last_error(), "varlen is null: expected a flashjit_varlen")
        status = function(None, ref(t), ref(t), ref(t), ref(t), None, None, ref(t), ref(t),
                          ref(t), ref(self.varlen), None, None)
        self.assertEqual(status, _capi.INVALID_ARGUMENT)
        self.assertEqual(lib.last_error(), "dout is null: expected a flashjit_tensor")
        status = function(None, ref(t), ref(t), ref(t), ref(t), ref(t), None, ref(t), ref(t),
                          ref(t), ref(self.varlen), ref(self.options), None)
        self.assertEqual(status, _capi.INVALID_ARGUMENT)
        self.assertIn("engine is null", lib.last_error())
        size = lib.backward_function("flashjit_backward_workspace_bytes_varlen")
        self.assertEqual(size(None, ref(t), ref(t), ref(t), None, None, None),
                         _capi.INVALID_ARGUMENT)
        self.assertEqual(lib.last_error(), "varlen is null: expected a flashjit_varlen")
        select = lib.backward_function("flashjit_select_backward_variant_varlen")
        buf = ctypes.create_string_buffer(64)
        self.assertEqual(select(None, None, ref(t), ref(t), ref(self.varlen), None, buf, 64),
                         _capi.INVALID_ARGUMENT)
        self.assertEqual(lib.last_error(), "q is null: expected a flashjit_tensor")

    def test_engine_methods_raise_the_librarys_error(self):
        # An Engine over no handle: the raw methods reach the C API, which refuses the engine.
        engine, t, varlen = _capi.Engine(self.lib, None), self.t, self.varlen
        calls = {
            "flashjit_backward_varlen": lambda: engine.backward_varlen_raw(
                t, t, t, t, t, 0x300000, t, t, t, varlen, self.options),
            "flashjit_backward_workspace_bytes_varlen":
                lambda: engine.backward_workspace_bytes_varlen_raw(t, t, t, varlen, self.options),
            "flashjit_select_backward_variant_varlen":
                lambda: engine.select_backward_variant_varlen_raw(t, t, t, varlen, self.options),
        }
        tensors = (_capi.FlashjitTensor * 4)(t, t, t, t)
        forward_options = _capi.FlashjitForwardOptions()
        calls["flashjit_forward"] = lambda: engine.forward_at(
            ctypes.addressof(tensors), ctypes.addressof(forward_options), None)
        for function, call in calls.items():
            with self.subTest(function=function):
                with self.assertRaises(flashjit.InvalidArgumentError) as caught:
                    call()
                self.assertEqual(caught.exception.function, function)
                self.assertIn("engine is null", caught.exception.message)


class Cache(unittest.TestCase):
    def test_precompile_list_clear(self):
        name = a_variant()
        with tempfile.TemporaryDirectory() as tmp:
            self.assertEqual(cache.list(cache_dir=tmp), [])
            cache.precompile([name], cache_dir=tmp)  # the C API
            entries = cache.list(cache_dir=tmp)
            self.assertEqual([e["name"] for e in entries], [name])
            self.assertEqual(entries[0]["state"], "current")
            self.assertEqual(cache.list(arch="sm_90a", cache_dir=tmp), [])
            self.assertIn("removed 1 entries", cache.clear(cache_dir=tmp))
            self.assertEqual(cache.list(cache_dir=tmp), [])

    def test_precompile_by_arch_runs_the_cli(self):
        with tempfile.TemporaryDirectory() as tmp:
            summary = cache.precompile(arch="sm_80", cache_dir=tmp, options=[
                "--family", "simt", "--head-dim", "32", "--dtype", "bf16", "--causal", "no"])
            self.assertIn("0 failed", summary)
            self.assertEqual(len(cache.list(cache_dir=tmp)), 1)

    def test_precompile_arguments(self):
        with self.assertRaises(ValueError):
            cache.precompile()
        with self.assertRaises(ValueError):
            cache.precompile(["x"], arch="sm_90a")

    def test_missing_cli_says_where_it_looked(self):
        with mock.patch.dict(os.environ, {"FLASHJIT_CLI": "/nonexistent/flashjit"}):
            with self.assertRaises(cache.CliNotFoundError) as caught:
                cache.list()
        self.assertIn("FLASHJIT_CLI", str(caught.exception))


class Main(unittest.TestCase):
    def run_module(self, *args, cache_dir):
        env = dict(os.environ, FLASHJIT_CACHE_DIR=cache_dir)
        return subprocess.run([sys.executable, "-m", "flashjit", *args], capture_output=True,
                              text=True, env=env)

    def test_info(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = self.run_module(cache_dir=tmp)
        self.assertEqual(out.returncode, 0, out.stderr)
        for label in ("library", "NVRTC", "families", "NVRTC archs", "cache", "torch"):
            self.assertIn(label, out.stdout)
        self.assertIn(tmp, out.stdout)

    def test_info_json_and_cli_passthrough(self):
        import json
        with tempfile.TemporaryDirectory() as tmp:
            info = json.loads(self.run_module("--json", cache_dir=tmp).stdout)
            self.assertEqual(info["cli"]["info"]["cache"]["dir"], tmp)
            self.assertIn("mma", info["library"]["families"])
            listed = self.run_module("list", "--json", cache_dir=tmp)
            self.assertEqual((listed.returncode, listed.stdout.strip()), (0, "[]"))


@unittest.skipUnless(HAVE_TORCH, NO_TORCH)
class TorchWithoutGpu(unittest.TestCase):
    """Argument checks and fake (meta) shapes: no GPU needed, nothing reaches the library."""

    @classmethod
    def setUpClass(cls):
        import torch
        cls.torch = torch

    def meta(self, *shape, dtype=None):
        return self.torch.empty(*shape, dtype=dtype or self.torch.bfloat16, device="meta")

    def test_cpu_tensors_are_refused(self):
        torch = self.torch
        q = torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16)
        with self.assertRaisesRegex(ValueError, "q is on cpu: flashjit runs on CUDA tensors"):
            flashjit.attention(q, q, q)
        with self.assertRaisesRegex(ValueError, "on cpu"):
            flashjit.merge_attention_states(q, torch.zeros(1, 2, 8), q, torch.zeros(1, 2, 8))

    def test_one_packing_of_four_tensors_is_four_views(self):
        # The eager hot path packs q, k, v and out with one struct call: the bytes must be those
        # of four FlashjitTensor built field by field (make_tensor).
        from flashjit import ops
        torch = self.torch
        tensors = [torch.empty(2, 8, 3, 64, dtype=torch.bfloat16).transpose(1, 2),
                   torch.empty(2, 16, 1, 64, dtype=torch.float16)]
        packed = (_capi.FlashjitTensor * 4)()
        fields = []
        for i in range(4):
            t = tensors[i % 2]
            fields += [t.data_ptr(), ops._CODES[t.dtype], *t.shape, *t.stride()]
        ops._TENSORS.pack_into(packed, 0, *fields)
        for i in range(4):
            t = tensors[i % 2]
            dtype = "bf16" if t.dtype == torch.bfloat16 else "fp16"
            expected = _capi.make_tensor(t.data_ptr(), dtype, t.shape, t.stride())
            self.assertEqual(bytes(packed[i]), bytes(expected))
        self.assertEqual(ops._TENSORS.size, 4 * _capi.TENSOR_BYTES)

    def test_argument_checks(self):
        torch = self.torch
        q = self.meta(1, 8, 2, 64)
        with self.assertRaisesRegex(ValueError, "expected 4 dims"):
            flashjit.attention(q[0], q, q)
        with self.assertRaisesRegex(ValueError, "torch.float32"):
            flashjit.attention(q.float(), q, q)
        with self.assertRaisesRegex(ValueError, "softmax_scale -1"):
            flashjit.attention(q, q, q, softmax_scale=-1)
        with self.assertRaisesRegex(ValueError, "sink_logits"):
            flashjit.attention(q, q, q, sink_logits=self.meta(2))
        with self.assertRaisesRegex(ValueError, "alibi_slopes"):
            flashjit.attention(q, q, q, alibi_slopes=self.meta(2, 2))
        with self.assertRaisesRegex(ValueError, "cu_seqlens_k is None"):
            cu = torch.zeros(2, dtype=torch.int32, device="meta")
            flashjit.attention_varlen(q[0], q[0], q[0], cu, None, 8, 8)
        with self.assertRaisesRegex(ValueError, "page_table"):
            flashjit.attention_with_kvcache(q, q, q, page_table=self.meta(1, 4))

    def test_fake_shapes(self):
        torch = self.torch
        q, k = self.meta(2, 8, 4, 64), self.meta(2, 16, 2, 64)
        out, lse = flashjit.attention(q, k, k, return_lse=True)
        self.assertEqual((out.shape, lse.shape, lse.dtype),
                         ((2, 8, 4, 64), (2, 4, 8), torch.float32))
        self.assertEqual(flashjit.attention(q, k, k).shape, (2, 8, 4, 64))
        cu = torch.zeros(3, dtype=torch.int32, device="meta")
        out, lse = flashjit.attention_varlen(q[0], k[0], k[0], cu, cu, 8, 16, return_lse=True)
        self.assertEqual((out.shape, lse.shape), ((8, 4, 64), (4, 8)))
        pages = self.meta(10, 16, 2, 64)
        table = torch.zeros(2, 5, dtype=torch.int32, device="meta")
        out = flashjit.attention_with_kvcache(q[:, :1], pages, pages, page_table=table)
        self.assertEqual(out.shape, (2, 1, 4, 64))
        merged, merged_lse = flashjit.merge_attention_states(q, lse_a := self.meta(
            2, 4, 8, dtype=torch.float32), q, lse_a)
        self.assertEqual((merged.shape, merged_lse.shape), (q.shape, lse_a.shape))

    def test_compile_fullgraph_traces_the_fake(self):
        torch = self.torch

        def block(q, k, v):
            return flashjit.attention(q, k, v, causal=True).sum(dim=-1)

        compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
        q = self.meta(2, 8, 4, 64)
        self.assertEqual(compiled(q, q, q).shape, (2, 8, 4))

    def test_user_function_argument_checks(self):
        torch = self.torch
        from flashjit import ops
        q = self.meta(1, 8, 2, 64)
        doc = torch.zeros(8, dtype=torch.int32, device="meta")
        functions = flashjit.UserFunctions(mask_mod=DOC_MASK)
        with self.assertRaisesRegex(ValueError, "user_args without user_functions"):
            flashjit.attention(q, q, q, user_args=[doc])
        with self.assertRaisesRegex(TypeError, "user_functions has type str"):
            flashjit.attention(q, q, q, user_functions=functions.hash)
        with self.assertRaisesRegex(ValueError, "user_args has 9 entries"):
            flashjit.attention(q, q, q, user_functions=functions, user_args=[doc] * 9)
        with self.assertRaisesRegex(TypeError, r"user_args\[0\] has type float"):
            flashjit.attention(q, q, q, user_functions=functions, user_args=[1.5])
        with self.assertRaisesRegex(ValueError, r"user_args\[1\] has strides"):
            flashjit.attention(q, q, q, user_functions=functions,
                               user_args=[None, self.meta(4, 4).t()])
        with self.assertRaisesRegex(ValueError, r"user_args\[0\] is on cpu"):
            flashjit.attention_with_kvcache(q, q, q, user_functions=functions,
                                            user_args=[torch.zeros(8, dtype=torch.int32)])
        with self.assertRaisesRegex(TypeError, "block_mask has type object"):
            flashjit.attention(q, q, q, user_functions=functions, block_mask=object())
        mask = ops.BlockMask(None, [])  # no GPU: a mask without a library handle
        with self.assertRaisesRegex(ValueError, "block_mask without user_functions"):
            flashjit.attention(q, q, q, block_mask=mask)
        with self.assertRaisesRegex(ValueError, "user_functions is None"):
            flashjit.create_block_mask(q, q, q, user_functions=None)
        gone = ops.BlockMask(None, [])._id  # dropped at once: its id no longer resolves
        with self.assertRaisesRegex(ValueError, f"BlockMask #{gone} no longer exists"):
            ops._block_mask_of(gone)
        self.assertIs(ops._block_mask_of(mask._id), mask)

    def test_fake_shapes_with_user_functions(self):
        torch = self.torch
        functions = flashjit.UserFunctions(BIAS, DOC_MASK)
        q, k = self.meta(2, 8, 4, 64), self.meta(2, 16, 2, 64)
        args = dict(user_functions=functions,
                    user_args=[torch.zeros(16, dtype=torch.int32, device="meta"), 0x7f0000000000])
        out, lse = flashjit.attention(q, k, k, return_lse=True, **args)
        self.assertEqual((out.shape, lse.shape), ((2, 8, 4, 64), (2, 4, 8)))
        cu = torch.zeros(3, dtype=torch.int32, device="meta")
        self.assertEqual(flashjit.attention_varlen(q[0], k[0], k[0], cu, cu, 8, 16, **args).shape,
                         (8, 4, 64))
        self.assertEqual(flashjit.attention_with_kvcache(q, k, k, **args).shape, (2, 8, 4, 64))

    def test_compile_fullgraph_with_user_functions_and_masks(self):
        torch = self.torch
        import torch._dynamo.testing
        from flashjit import ops
        functions = flashjit.UserFunctions(mask_mod=DOC_MASK)

        def block(q, doc, mask):
            return flashjit.attention(q, q, q, causal=True, user_functions=functions,
                                      user_args=[doc, 0x7f0000000000], block_mask=mask).sum(-1)

        counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(block, fullgraph=True, backend=counter)
        q, doc = self.meta(2, 8, 4, 64), torch.zeros(8, dtype=torch.int32, device="meta")
        masks = [ops.BlockMask(None, []) for _ in range(4)]
        for mask in masks:  # a new mask each step, as a training loop makes them
            self.assertEqual(compiled(q, doc, mask).shape, (2, 8, 4))
        # One recompile for the second mask's id, then the id is a dynamic int.
        self.assertLessEqual(counter.frame_count, 2)

    def test_gradients_have_the_inputs_shapes(self):
        # Meta tensors run the ops' fake implementations: the autograd formula end to end.
        torch = self.torch
        q = self.meta(2, 8, 4, 64).requires_grad_()
        k, v = self.meta(2, 16, 2, 64).requires_grad_(), self.meta(2, 16, 2, 64).requires_grad_()
        for causal, deterministic in ((False, False), (True, True)):
            out = flashjit.attention(q, k, v, causal=causal, deterministic=deterministic)
            self.assertTrue(out.requires_grad)
            dq, dk, dv = torch.autograd.grad(out.float().sum(), (q, k, v))
            self.assertEqual((dq.shape, dk.shape, dv.shape), (q.shape, k.shape, v.shape))
            self.assertEqual(dk.dtype, torch.bfloat16)
        # Only some inputs wanting gradients is fine too.
        out = flashjit.attention(q, k.detach(), v.detach())
        self.assertEqual(torch.autograd.grad(out.sum(), q)[0].shape, q.shape)

    def test_the_lse_is_not_differentiable(self):
        q = self.meta(1, 8, 2, 64).requires_grad_()
        out, lse = flashjit.attention(q, q, q, return_lse=True)
        self.assertTrue(out.requires_grad)
        self.assertFalse(lse.requires_grad)

    def test_the_op_without_lse_still_differentiates(self):
        # torch.ops.flashjit.attention called directly with return_lse=False: the formula runs
        # the forward again for its LSE.
        torch = self.torch
        q = self.meta(1, 8, 2, 64).requires_grad_()
        out, lse = torch.ops.flashjit.attention(q, q, q, False, 0.0, False, -1, -1, 0.0, None,
                                                None, 0, None, None, [], [], 0, False)
        self.assertEqual(lse.numel(), 0)
        self.assertEqual(torch.autograd.grad(out.sum(), q)[0].shape, q.shape)

    def test_unsupported_backwards_say_what_is_missing(self):
        torch = self.torch
        from flashjit import ops
        q = self.meta(1, 8, 2, 64).requires_grad_()
        masking = flashjit.UserFunctions(mask_mod=DOC_MASK)
        biasing = flashjit.UserFunctions(score_mod=BIAS)
        doc = torch.zeros(8, dtype=torch.int32, device="meta")
        bias = torch.zeros(2, dtype=torch.float32, device="meta")
        mask = ops.BlockMask(None, [])  # no GPU: a mask without a library handle
        self.assertTrue(masking.differentiable)
        self.assertFalse(biasing.differentiable)
        # A score_mod without its derivative: the forward runs, its backward says what is missing.
        out = flashjit.attention(q, q, q, user_functions=biasing, user_args=[None, bias])
        with self.assertRaisesRegex(NotImplementedError,
                                    "does not take user_functions with a score_mod but no "
                                    "score_mod_grad"):
            out.sum().backward()
        # A mask_mod (with or without its block mask) and a score_mod with its derivative do.
        with_grad = flashjit.UserFunctions(score_mod=BIAS, score_mod_grad=BIAS_GRAD)
        self.assertTrue(with_grad.differentiable)
        for kwargs in (dict(user_functions=masking, user_args=[doc]),
                       dict(user_functions=masking, user_args=[doc], block_mask=mask),
                       dict(user_functions=with_grad, user_args=[None, bias])):
            with self.subTest(kwargs=sorted(kwargs)):
                out = flashjit.attention(q, q, q, **kwargs)
                self.assertEqual(torch.autograd.grad(out.sum(), q)[0].shape, q.shape)
        # The score variants have a backward: no error.
        out = flashjit.attention(q, q, q, softcap=5.0, window_left=16, window_right=0,
                                 alibi_slopes=self.meta(2, dtype=torch.float32))
        self.assertEqual(torch.autograd.grad(out.sum(), q)[0].shape, q.shape)
        for out in (flashjit.attention_with_kvcache(q, q, q),
                    flashjit.merge_attention_states(q, lse := self.meta(1, 2, 8,
                                                                        dtype=torch.float32),
                                                    q, lse)[0]):
            with self.assertRaisesRegex(NotImplementedError, "KV-cache .* not implemented"):
                out.sum().backward()

    def test_attention_backward_checks_and_shapes(self):
        torch = self.torch
        q, k = self.meta(2, 8, 4, 64), self.meta(2, 16, 2, 64)
        lse = self.meta(2, 4, 8, dtype=torch.float32)
        dq, dk, dv = flashjit.attention_backward(q, k, k, q, q, lse, causal=True)
        self.assertEqual((dq.shape, dk.shape, dv.shape), (q.shape, k.shape, k.shape))
        with self.assertRaisesRegex(ValueError, r"lse has shape \(2, 8, 4\): expected \(2, 4, 8\)"):
            flashjit.attention_backward(q, k, k, q, q, lse.transpose(1, 2))
        with self.assertRaisesRegex(ValueError, "dout has shape"):
            flashjit.attention_backward(q, k, k, q, q[:, :4], lse)
        with self.assertRaisesRegex(ValueError, "lse is torch.bfloat16"):
            flashjit.attention_backward(q, k, k, q, q, lse.bfloat16())
        with self.assertRaisesRegex(ValueError, "softmax_scale 0"):
            flashjit.attention_backward(q, k, k, q, q, lse, softmax_scale=0)
        with self.assertRaisesRegex(ValueError, "dout is on cpu"):
            flashjit.attention_backward(q, k, k, q, torch.zeros(q.shape, dtype=q.dtype), lse)

    def test_compile_fullgraph_with_backward(self):
        torch = self.torch

        def loss(q, k, v):
            return flashjit.attention(q, k, v, causal=True).float().square().sum()

        compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
        q = self.meta(2, 8, 4, 64).requires_grad_()
        k, v = self.meta(2, 16, 2, 64).requires_grad_(), self.meta(2, 16, 2, 64).requires_grad_()
        compiled(q, k, v).backward()
        self.assertEqual((q.grad.shape, k.grad.shape, v.grad.shape), (q.shape, k.shape, v.shape))


@unittest.skipUnless(HAVE_TORCH, NO_TORCH)
class VarlenBackwardWithoutGpu(unittest.TestCase):
    """flashjit.attention_varlen's backward on meta tensors: argument checks, the fake
    implementation's shapes, autograd end to end and what raises NotImplementedError."""

    @classmethod
    def setUpClass(cls):
        import torch
        cls.torch = torch

    def meta(self, *shape, dtype=None):
        return self.torch.empty(*shape, dtype=dtype or self.torch.bfloat16, device="meta")

    def offsets(self, batch=3):
        return self.torch.zeros(batch + 1, dtype=self.torch.int32, device="meta")

    def test_fake_shapes(self):
        torch = self.torch
        q, k = self.meta(40, 8, 64), self.meta(50, 2, 64)
        lse, cu = self.meta(8, 40, dtype=torch.float32), self.offsets()
        dq, dk, dv = flashjit.attention_varlen_backward(q, k, k, q, q, lse, cu, cu, 20, 25,
                                                        causal=True, deterministic=True)
        self.assertEqual((dq.shape, dk.shape, dv.shape), (q.shape, k.shape, k.shape))
        self.assertEqual((dq.dtype, dk.dtype), (torch.bfloat16, torch.bfloat16))
        sink = self.meta(8, dtype=torch.float32)
        grads = flashjit.attention_varlen_backward(
            q, k, k, q, q, lse, cu, cu, 20, 25, window_left=8, window_right=0, softcap=5.0,
            sink_logits=sink, alibi_slopes=sink, sink_tokens=2)
        self.assertEqual(len(grads), 4)
        self.assertEqual((grads[3].shape, grads[3].dtype), ((8,), torch.float32))
        # The op itself always returns four tensors (dsink empty without sinks).
        out = torch.ops.flashjit.attention_varlen_backward(
            q, k, k, q, q, lse, cu, cu, 20, 25, False, 0.0, False, 0.0, -1, -1, 0, None, None,
            None, [], [])
        self.assertEqual([tuple(t.shape) for t in out], [(40, 8, 64), (50, 2, 64), (50, 2, 64),
                                                         (0,)])

    def test_argument_checks(self):
        torch = self.torch
        q, k = self.meta(40, 8, 64), self.meta(50, 2, 64)
        lse, cu = self.meta(8, 40, dtype=torch.float32), self.offsets()
        backward = flashjit.attention_varlen_backward
        with self.assertRaisesRegex(ValueError, r"lse has shape \(40, 8\): expected \(8, 40\)"):
            backward(q, k, k, q, q, lse.t(), cu, cu, 20, 25)
        with self.assertRaisesRegex(ValueError, "lse has shape .* expected 2 dims"):
            backward(q, k, k, q, q, lse[None], cu, cu, 20, 25)
        with self.assertRaisesRegex(ValueError, "lse is torch.bfloat16"):
            backward(q, k, k, q, q, lse.bfloat16(), cu, cu, 20, 25)
        with self.assertRaisesRegex(ValueError, "dout has shape"):
            backward(q, k, k, q, q[:20], lse, cu, cu, 20, 25)
        with self.assertRaisesRegex(ValueError, "out has shape"):
            backward(q, k, k, q[:, :4], q, lse, cu, cu, 20, 25)
        with self.assertRaisesRegex(ValueError, "q has shape .* expected 3 dims"):
            backward(q[None], k, k, q, q, lse, cu, cu, 20, 25)
        with self.assertRaisesRegex(ValueError, "k has shape .* expected 3 dims"):
            backward(q, k[None], k, q, q, lse, cu, cu, 20, 25)
        with self.assertRaisesRegex(ValueError, "v is torch.float32"):
            backward(q, k, k.float(), q, q, lse, cu, cu, 20, 25)
        with self.assertRaisesRegex(ValueError, "cu_seqlens_k is None"):
            backward(q, k, k, q, q, lse, cu, None, 20, 25)
        with self.assertRaisesRegex(ValueError, "cu_seqlens_q is torch.int64"):
            backward(q, k, k, q, q, lse, cu.long(), cu, 20, 25)
        with self.assertRaisesRegex(ValueError, "cu_seqlens_k has 3 entries, cu_seqlens_q 4"):
            backward(q, k, k, q, q, lse, cu, self.offsets(2), 20, 25)
        with self.assertRaisesRegex(ValueError, "softmax_scale -2"):
            backward(q, k, k, q, q, lse, cu, cu, 20, 25, softmax_scale=-2)
        with self.assertRaisesRegex(ValueError, "dout is on cpu"):
            backward(q, k, k, q, torch.zeros(q.shape, dtype=q.dtype), lse, cu, cu, 20, 25)
        with self.assertRaisesRegex(ValueError, "cu_seqlens_k is on cpu"):
            backward(q, k, k, q, q, lse, cu, torch.zeros(4, dtype=torch.int32), 20, 25)

    def test_gradients_have_the_inputs_shapes(self):
        # Meta tensors run the ops' fake implementations: the autograd formula end to end.
        torch = self.torch
        cu = self.offsets()
        q = self.meta(40, 8, 64).requires_grad_()
        k, v = self.meta(50, 2, 64).requires_grad_(), self.meta(50, 2, 64).requires_grad_()
        sink = self.meta(8, dtype=torch.float32).requires_grad_()
        for kwargs in (dict(), dict(causal=True, deterministic=True),
                       dict(window_left=8, window_right=0, softcap=4.0, sink_tokens=2)):
            with self.subTest(**kwargs):
                out = flashjit.attention_varlen(q, k, v, cu, cu, 20, 25, **kwargs)
                self.assertTrue(out.requires_grad)
                dq, dk, dv = torch.autograd.grad(out.float().sum(), (q, k, v))
                self.assertEqual((dq.shape, dk.shape, dv.shape), (q.shape, k.shape, v.shape))
                self.assertEqual(dk.dtype, torch.bfloat16)
        # The sink logits get their gradient, fp32 [heads_q].
        out = flashjit.attention_varlen(q, k, v, cu, cu, 20, 25, sink_logits=sink)
        dq, dsink = torch.autograd.grad(out.sum(), (q, sink))
        self.assertEqual((dq.shape, dsink.shape, dsink.dtype), (q.shape, (8,), torch.float32))
        # Only some inputs wanting gradients is fine too; the LSE is not differentiable.
        out, lse = flashjit.attention_varlen(q, k.detach(), v.detach(), cu, cu, 20, 25,
                                             return_lse=True)
        self.assertFalse(lse.requires_grad)
        self.assertEqual(torch.autograd.grad(out.sum(), q)[0].shape, q.shape)

    def test_the_op_without_lse_still_differentiates(self):
        # torch.ops.flashjit.attention_varlen called directly with return_lse=False: the formula
        # runs the forward again for its LSE.
        torch = self.torch
        q, cu = self.meta(40, 2, 64).requires_grad_(), self.offsets()
        out, lse = torch.ops.flashjit.attention_varlen(
            q, q, q, cu, cu, 20, 20, None, None, True, 0.0, False, -1, -1, 0.0, None, None, 0, 0,
            None, None, [], [], 0, False)
        self.assertEqual(lse.numel(), 0)
        self.assertEqual(torch.autograd.grad(out.sum(), q)[0].shape, q.shape)

    def test_what_has_no_varlen_backward_says_so(self):
        torch = self.torch
        from flashjit import ops
        cu = self.offsets(2)
        q = self.meta(40, 4, 64).requires_grad_()
        k = self.meta(40, 2, 64)
        pages = self.meta(10, 16, 2, 64)
        table = torch.zeros(2, 5, dtype=torch.int32, device="meta")
        used = torch.zeros(2, dtype=torch.int32, device="meta")
        functions = flashjit.UserFunctions(score_mod=BIAS)  # no score_mod_grad
        bias = torch.zeros(4, dtype=torch.float32, device="meta")
        cases = ((dict(k=pages, cu_k=None, page_table=table), "page_table"),
                 (dict(seqused_k=used), "seqused_k"),
                 (dict(k=pages, cu_k=None, page_table=table, seqused_k=used),
                  "page_table, seqused_k"),
                 (dict(user_functions=functions, user_args=[None, bias]),
                  "user_functions with a score_mod but no score_mod_grad"))
        for kwargs, named in cases:
            with self.subTest(named=named):
                keys, cu_k = kwargs.pop("k", k), kwargs.pop("cu_k", cu)
                out = flashjit.attention_varlen(q, keys, keys, cu, cu_k, 20, 80, **kwargs)
                with self.assertRaisesRegex(NotImplementedError,
                                            f"attention_varlen's backward does not take "
                                            f"{named}"):
                    out.sum().backward()
        # A mask_mod, with its block mask or not, has one.
        masking = flashjit.UserFunctions(mask_mod=DOC_MASK)
        doc = torch.zeros(40, dtype=torch.int32, device="meta")
        for kwargs in (dict(user_functions=masking, user_args=[doc]),
                       dict(user_functions=masking, user_args=[doc],
                            block_mask=ops.BlockMask(None, []))):
            out = flashjit.attention_varlen(q, k, k, cu, cu, 20, 20, **kwargs)
            self.assertEqual(torch.autograd.grad(out.sum(), q)[0].shape, q.shape)
        # The backward op itself has no backward (no double backward).
        q2, k2 = self.meta(40, 4, 64).requires_grad_(), self.meta(40, 2, 64)
        lse = self.meta(4, 40, dtype=torch.float32)
        dq, _, _ = flashjit.attention_varlen_backward(q2, k2, k2, q2, q2, lse, cu, cu, 20, 20)
        with self.assertRaisesRegex(NotImplementedError, "double backward"):
            dq.float().sum().backward()

    def test_compile_fullgraph_with_backward(self):
        torch = self.torch

        def loss(q, k, v, cu_q, cu_k):
            out = flashjit.attention_varlen(q, k, v, cu_q, cu_k, 20, 25, causal=True,
                                            deterministic=True)
            return out.float().square().sum()

        compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
        cu = self.offsets()
        q = self.meta(40, 4, 64).requires_grad_()
        k, v = self.meta(50, 2, 64).requires_grad_(), self.meta(50, 2, 64).requires_grad_()
        compiled(q, k, v, cu, cu).backward()
        self.assertEqual((q.grad.shape, k.grad.shape, v.grad.shape), (q.shape, k.shape, v.shape))


if __name__ == "__main__":
    unittest.main()
