"""docs/metrics.md documents every metric Loom registers (coordinator/metrics.cc,
worker/worker_metrics.cc), with its type, and names none that does not exist."""
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from deploy_support import SOURCE_DIR, exported_metrics  # noqa: E402

DOC = SOURCE_DIR / "docs" / "metrics.md"


def registered() -> dict[str, str]:
    """Base name -> type (histograms without their _bucket/_sum/_count)."""
    out = {}
    for name, kind in exported_metrics().items():
        if kind == "histogram":
            name = re.sub(r"_(bucket|sum|count)$", "", name)
        out[name] = kind
    return out


def documented() -> dict[str, str]:
    """Table rows of docs/metrics.md: `name` -> type column."""
    rows = re.findall(r"^\| `(loom_\w+)` \| (\w+) \|", DOC.read_text(), re.M)
    return dict(rows)


def test_every_registered_metric_is_documented_with_its_type():
    metrics = registered()
    assert "loom_time_to_first_token_seconds" in metrics and len(metrics) > 20
    docs = documented()
    missing = sorted(set(metrics) - set(docs))
    assert not missing, f"docs/metrics.md lacks {missing}"
    wrong = {n: (docs[n], k) for n, k in metrics.items() if docs[n] != k}
    assert not wrong, f"documented type differs from the registration: {wrong}"


def test_no_documented_metric_is_stale():
    stale = sorted(set(documented()) - set(registered()))
    assert not stale, f"docs/metrics.md documents metrics nobody registers: {stale}"


def test_process_metrics_are_documented():
    """The process_* series of common/process_metrics.cc (built by hand, not by Build*())."""
    names = set(re.findall(r'"(process_[a-z_]+)"', (SOURCE_DIR / "common" / "process_metrics.cc").read_text()))
    assert len(names) == 6, names
    text = DOC.read_text()
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert not missing, f"docs/metrics.md lacks {missing}"
