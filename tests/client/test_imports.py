"""What ``import llmroute`` loads: the client and its routing, never the SGLang launcher."""

from __future__ import annotations

import json
import subprocess
import sys


def test_import_llmroute_loads_no_sglang_module() -> None:
    code = (
        "import json, sys, llmroute\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('llmroute'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = json.loads(out.stdout)
    assert "llmroute.routing.server_metrics" in loaded  # the poller the routing uses
    assert [m for m in loaded if m.startswith("llmroute.sglang")] == []


def test_the_sglang_package_still_offers_the_poller_and_its_names() -> None:
    import llmroute.sglang as sglang
    from llmroute.routing import server_metrics

    assert sglang.MetricsPoller is server_metrics.MetricsPoller
    assert sglang.PrometheusSample is server_metrics.PrometheusSample
    assert sglang.Sample is server_metrics.PrometheusSample  # the name it had before
    assert {"MetricsPoller", "parse_prometheus", "diagnose_ttft"} <= set(sglang.__all__)
