"""The library's TINYLLM_* switches (tinyllm.kernels.switches): read once into one frozen Switches, each
variable to its field, and no other module of the library reading them from the environment."""

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tinyllm.kernels import switches
from tinyllm.kernels.switches import Switches, read

ROOT = Path(__file__).resolve().parents[2]

# variable, value -> field, what it reads as
CASES = [
    ("CPU_KERNEL", "0", "cpu_kernel", False),
    ("CACHE_DIR", "/tmp/kernels", "cache_dir", "/tmp/kernels"),
    ("QGEMV", "0", "qgemv", False),
    ("QGEMV_FOLD", "compiled", "qgemv_fold", "compiled"),
    ("QGEMV_BLOCKS", "8,256,4,0,0", "qgemv_blocks", "8,256,4,0,0"),
    ("DECODE_ATTN", "0", "decode_attn", False),
    ("ROPE_ATTN", "0", "rope_attn", False),
    ("CPU_ATTN", "0", "cpu_attn", False),
    ("ATTN_TILE", "0", "attn_tile", 0),
    ("PDL", "kernels", "pdl", "kernels"),
    ("TRACE_DIR", "/tmp/traces", "trace_dir", "/tmp/traces"),
    ("INT4_DP4A", "auto", "int4_dp4a", "auto"),
    ("INT4_KERNEL", "bytes", "int4_kernel", "bytes"),
    ("INT8_KERNEL", "bytes", "int8_kernel", "bytes"),
    ("CUDA_SAVED_STEP", "1", "cuda_saved_step", True),
]


def test_an_empty_environment_reads_as_the_defaults():
    assert read({}) == Switches()
    assert read({f"TINYLLM_{name}": "" for name, *_ in CASES}) == Switches()  # set but empty: the default
    assert Switches().qgemv_fold == "plain" and Switches().attn_tile == 128 and Switches().cpu_kernel


@pytest.mark.parametrize("name,value,field,want", CASES, ids=[c[0] for c in CASES])
def test_each_variable_sets_its_field_and_only_that(name, value, field, want):
    got = read({f"TINYLLM_{name}": value})
    assert getattr(got, field) == want
    assert dataclasses.replace(got, **{field: getattr(Switches(), field)}) == Switches()


def test_a_path_is_off_only_for_0():
    for value in ("1", "yes", "on", "false"):
        assert read({"TINYLLM_CPU_KERNEL": value}).cpu_kernel, value
        assert read({"TINYLLM_QGEMV": value}).qgemv, value


def test_a_tile_that_is_not_a_number_is_a_one_line_error():
    with pytest.raises(ValueError, match="TINYLLM_ATTN_TILE must be a whole number of keys, got 'wide'"):
        read({"TINYLLM_ATTN_TILE": "wide"})


def test_a_dp4a_choice_other_than_0_1_or_auto_is_a_one_line_error():
    assert read({"TINYLLM_INT4_DP4A": "1"}).int4_dp4a == "1" and Switches().int4_dp4a == "0"
    with pytest.raises(ValueError, match="TINYLLM_INT4_DP4A must be 0, 1 or auto, got 'yes'"):
        read({"TINYLLM_INT4_DP4A": "yes"})
    with pytest.raises(ValueError, match="TINYLLM_INT4_KERNEL must be bytes or words, got 'nibbles'"):
        read({"TINYLLM_INT4_KERNEL": "nibbles"})
    with pytest.raises(ValueError, match="TINYLLM_INT8_KERNEL must be bytes or words, got 'dp4a'"):
        read({"TINYLLM_INT8_KERNEL": "dp4a"})


def test_the_switches_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        switches.SWITCHES.cpu_kernel = False  # type: ignore[misc]


def test_no_other_library_module_reads_a_switch_from_the_environment():
    """Only switches.py names a TINYLLM_ variable in code; the three the C++ kernels read
    themselves at load (its docstring lists them) are the exceptions."""
    literal = re.compile(r"""["']TINYLLM_[A-Z_]+["']""")
    found = {}
    for path in sorted((ROOT / "tinyllm").rglob("*")):
        if path.suffix in (".py", ".cpp", ".h") and path.name != "switches.py":
            names = literal.findall(path.read_text())
            if names:
                found[path.name] = sorted(n.strip("\"'") for n in names)
    assert found == {"cpu_products.cpp": ["TINYLLM_CPU_EXACT_X"], "cpu_vnni.cpp": ["TINYLLM_CPU_VNNI"],
                     "cpu_pool.cpp": ["TINYLLM_CPU_MIN_BLOCKS"]}
    doc = switches.__doc__
    assert all(name in doc for name in ("TINYLLM_CPU_VNNI", "TINYLLM_CPU_EXACT_X", "TINYLLM_CPU_MIN_BLOCKS"))


def test_a_process_started_with_a_switch_reads_it_once():
    """TINYLLM_CPU_KERNEL=0 in a child's environment: its switches say so, and the CPU kernels
    are off there without a warning (a deliberate choice); a change to the environment after
    start changes nothing."""
    code = ("import os, warnings; warnings.simplefilter('error')\n"
            "from tinyllm.kernels import cpu_qgemv, switches\n"
            "os.environ['TINYLLM_CPU_KERNEL'] = '1'\n"
            "print(switches.SWITCHES.cpu_kernel, cpu_qgemv.available())")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TINYLLM_")}, "PYTHONPATH": str(ROOT),
           "TINYLLM_CPU_KERNEL": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
