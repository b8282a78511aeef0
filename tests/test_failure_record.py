"""A failure record names what ran, whatever the model's source (issue 48): an out-of-memory run of a model from a
Hugging Face config records the resolved model (not the preset's unset '???' sizes) and its memory plan."""
from __future__ import annotations

import json

from tests.conftest import CPU_FAST, REPO, run_bench

SMALL = ["model.n_layers=1", "model.d_model=64", "model.n_heads=2", "model.n_kv_heads=1", "model.d_ff=128",
         "model.vocab_size=256", "model.seq_len=32", "model.global_batch=2"]


def test_an_oom_of_a_hugging_face_model_records_the_resolved_model_and_its_plan(tmp_path):
    r = run_bench("model=hf", f"model.hf_config={REPO / 'tests/data/hf/llama-3.2-1b'}", *SMALL, *CPU_FAST,
                  "compile=false", "fault.kind=oom", "fault.step=1", run_dir=tmp_path)
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["status"] == "oom", r.stdout[-2000:] + r.stderr[-2000:]
    model = m["config"]["model"]
    assert model["name"] == "llama-3.2-1b" and model["seq_len"] == 32 and model["d_model"] == 64
    assert model["hf_config_file"] and "???" not in json.dumps(m["config"])
    assert m["memory"]["plan"]["layout"]["micro_batch_size"] == 2 and m["memory"]["plan"]["parameters"] > 0
    assert "allocator" in m["memory"]  # the failed rank's allocator figures (None on a CPU)
