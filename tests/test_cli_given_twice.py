"""An option that names one value per key, given twice for one key, is refused naming both values (exit 2): the
last one silently won, so what ran depended on the order of the options."""

from __future__ import annotations

from pathlib import Path


def test_validate_refuses_a_peer_framework_given_twice(project: Path, run_cli) -> None:
    """`--peer pytorch=A --peer pytorch=B` used B and said nothing: the cross-framework tests ran against one of
    two images the user named."""
    code, out, err = run_cli("validate", "127.0.0.1:5000/foreign:1", "--matrix", str(project / "matrix.yaml"),
                             "--peer", "pytorch=127.0.0.1:5000/a:1", "--peer", "pytorch=127.0.0.1:5000/b:1")
    assert code == 2 and out == "", err
    assert err.strip().splitlines() == ["error: --peer pytorch= is given twice (127.0.0.1:5000/a:1 and "
                                        "127.0.0.1:5000/b:1); give one image for each framework"], err
