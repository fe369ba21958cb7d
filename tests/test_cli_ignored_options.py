"""An option that a command would ignore in the way it is called is refused naming it (exit 2), never dropped
silently: the user asked for something that would not have been done."""

from __future__ import annotations

from pathlib import Path


def test_keys_dev_refuses_the_options_it_would_ignore(run_cli, tmp_path: Path) -> None:
    """`keys --dev --out DIR` (or --name, --role) made or showed the dev key in its own place and ignored the option:
    the user was told nothing of DIR, which stayed empty."""
    for extra in (["--out", str(tmp_path)], ["--name", "ci-dev"], ["--role", "builder"]):
        code, out, err = run_cli("keys", "--dev", *extra)
        assert code == 2 and out == "", err
        assert err.strip().splitlines() == [f"error: --dev makes this machine's local dev key in its own place, in "
                                            f"both roles: {extra[0]} cannot go with it; drop --dev to make a key "
                                            "pair for a role"], err
    assert list(tmp_path.iterdir()) == []
