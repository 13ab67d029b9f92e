"""What a fresh interpreter imports: vLLM (seconds to import) only where it is needed, so
parsing a search space leaves it out."""

from __future__ import annotations

import importlib.util
import subprocess
import sys


def test_parsing_a_space_does_not_import_vllm():
    code = ("import sys; from tuner.speculative import schema; from tuner.search import space; "
            "space.load('default'); "
            "print(schema.vllm_schema().origin); print(sorted(m for m in sys.modules "
            "if m.split('.')[0] == 'vllm'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[-1] == "[]", out
    if importlib.util.find_spec("vllm") is not None:
        assert out[0].startswith("SpeculativeConfig of vLLM"), out  # read, not the fallback
