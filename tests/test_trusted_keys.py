"""config/trusted-keys.yaml is read as strictly as the matrix (issue 20, holes 2 and 3): a second
`keys:`, one public key under two names, or the local dev key (by its key, or by an entry that says
it is one) is bad input naming the line, never a silent choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from buildtool.attest.dsse import generate, write_private
from buildtool.attest.keys import load_trusted, trusted_entry
from buildtool.attest.verdict_statement import dev_key_path
from buildtool.common.errors import UserError

CI, OTHER = generate(), generate()


def write(root: Path, text: str) -> Path:
    (root / "config").mkdir(exist_ok=True)
    path = root / "config/trusted-keys.yaml"
    path.write_text(text)
    return path


def refusal(root: Path) -> str:
    with pytest.raises(UserError) as caught:
        load_trusted(root)
    assert caught.value.exit_code == 2
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_good_file_loads(tmp_path: Path) -> None:
    write(tmp_path, "keys:\n" + trusted_entry("ci", CI.public()) + trusted_entry("other", OTHER.public()))
    assert set(load_trusted(tmp_path).keys) == {CI.public().keyid, OTHER.public().keyid}


def test_a_second_keys_mapping_is_refused_naming_its_line(tmp_path: Path) -> None:
    """`keys: []` first, then the real list: PyYAML silently took the second."""
    write(tmp_path, "keys: []\nkeys:\n" + trusted_entry("ci", CI.public()))
    message = refusal(tmp_path)
    assert "config/trusted-keys.yaml:2" in message and "duplicate key" in message and "line 1" in message


def test_one_public_key_under_two_names_is_refused_naming_both_lines(tmp_path: Path) -> None:
    text = "keys:\n" + trusted_entry("ci-2026", CI.public()) + trusted_entry("ci-old", CI.public())
    write(tmp_path, text)
    message = refusal(tmp_path)
    second = 2 + trusted_entry("ci-2026", CI.public()).count("\n")
    assert "config/trusted-keys.yaml" in message and "listed twice" in message
    assert "ci-2026 (line 2)" in message and f"ci-old (line {second})" in message, message


def test_the_local_dev_key_is_never_a_trusted_key(tmp_path: Path) -> None:
    dev = generate()
    dev_key_path().parent.mkdir(parents=True, exist_ok=True)
    dev_key_path().unlink(missing_ok=True)
    write_private(dev_key_path(), dev)
    try:
        write(tmp_path, "keys:\n" + trusted_entry("ci", CI.public()) + trusted_entry("laptop", dev.public()))
        message = refusal(tmp_path)
        line = 2 + trusted_entry("ci", CI.public()).count("\n")
        assert f"config/trusted-keys.yaml:{line}" in message and "local dev key" in message
        assert str(dev_key_path()) in message and "--trust-local-key" in message
    finally:
        dev_key_path().unlink()


@pytest.mark.parametrize(("entry", "why"), [
    ("  - name: ci\n    dev: true\n", "says it is a dev key (it has a `dev` field)"),
    ("  - name: local dev key\n", "its name says it is a dev key"),
    ("  - name: alice-dev\n", "its name says it is a dev key"),
])
def test_an_entry_that_says_it_is_a_dev_key_is_refused(tmp_path: Path, entry: str, why: str) -> None:
    body = trusted_entry("x", OTHER.public()).split("\n", 1)[1]     # the key lines under a new name
    write(tmp_path, "keys:\n" + entry + body)
    message = refusal(tmp_path)
    assert "config/trusted-keys.yaml:2" in message and why in message, message


@pytest.mark.parametrize(("text", "why"), [
    ("keys:\n  - name: ci\n    public_key: x\n    owner: me\n", "unknown field owner"),
    ("keys:\n  - public_key: x\n", "needs name and public_key"),
    ("---\nkeys: []\n---\nkeys: []\n", "second YAML document"),
    ("", "empty"),
])
def test_other_malformed_files_are_refused_naming_the_line(tmp_path: Path, text: str, why: str) -> None:
    write(tmp_path, text)
    message = refusal(tmp_path)
    assert "config/trusted-keys.yaml" in message and why in message, message


def test_an_entry_without_roles_is_refused_naming_the_roles(tmp_path: Path) -> None:
    """Fail closed: a key with no roles is not trusted as everything (issue 25)."""
    entry = trusted_entry("ci", CI.public()).replace("    roles: [tester]\n", "")
    write(tmp_path, "keys:\n" + entry)
    message = refusal(tmp_path)
    assert "keys[0] (ci) needs `roles:`" in message and "builder and/or tester" in message


@pytest.mark.parametrize("roles, why", [("[]", "needs `roles:`"), ("tester", "needs `roles:`"),
                                        ("[tester, admin]", "unknown role admin")])
def test_bad_roles_are_refused_naming_them(tmp_path: Path, roles: str, why: str) -> None:
    entry = trusted_entry("ci", CI.public()).replace("roles: [tester]", f"roles: {roles}")
    write(tmp_path, "keys:\n" + entry)
    assert why in refusal(tmp_path)


def test_each_key_is_trusted_only_in_its_roles(tmp_path: Path) -> None:
    write(tmp_path, "keys:\n" + trusted_entry("builds", CI.public(), ("builder",))
          + trusted_entry("runners", OTHER.public(), ("tester",)))
    trusted = load_trusted(tmp_path)
    assert set(trusted.for_role("builder")) == {CI.public().keyid}
    assert set(trusted.for_role("tester")) == {OTHER.public().keyid}
    why = trusted.role_problem(CI.public().keyid, "tester")
    assert "trusted as builder, not as tester" in why and "(builds)" in why
    assert trusted.role_problem(OTHER.public().keyid, "tester") == ""


def test_a_key_in_both_roles_is_refused_unless_its_entry_says_so(tmp_path: Path) -> None:
    """Issue 37: one key listed as builder and tester released on its own, and nothing said the builder and
    the tester were then the same party. Both roles take `allow_both_roles: true` in that very entry."""
    both = trusted_entry("ci", CI.public(), ("builder",)).replace("roles: [builder]", "roles: [builder, tester]")
    write(tmp_path, "keys:\n" + both)
    message = refusal(tmp_path)
    assert "config/trusted-keys.yaml:2" in message and "keys[0] (ci) is trusted as both builder and tester" in message
    assert "allow_both_roles: true" in message
    write(tmp_path, "keys:\n" + both.replace("roles: [builder, tester]\n",
                                             "roles: [builder, tester]\n    allow_both_roles: yes-please\n"))
    assert "allow_both_roles is 'yes-please', not true or false" in refusal(tmp_path)
    write(tmp_path, "keys:\n" + trusted_entry("ci", CI.public(), ("builder", "tester")))
    assert "allow_both_roles: true" in trusted_entry("ci", CI.public(), ("builder", "tester"))
    assert load_trusted(tmp_path).roles[CI.public().keyid] == frozenset({"builder", "tester"})
    write(tmp_path, "keys:\n" + trusted_entry("ci", CI.public(), ("tester",)) + trusted_entry("b", OTHER.public(),
                                                                                               ("builder",)))
    assert "allow_both_roles" not in (tmp_path / "config/trusted-keys.yaml").read_text()
    assert len(load_trusted(tmp_path).keys) == 2


@pytest.mark.parametrize(("extra", "after", "why"), [
    ("other", False, "holds 2 PEM blocks, not one"),
    ("other", True, "holds 2 PEM blocks, not one"),
    ("text", False, "holds text before or after its PEM block"),
    ("text", True, "holds text before or after its PEM block"),
])
def test_a_public_key_entry_with_a_second_block_or_other_text_is_refused(tmp_path: Path, extra: str, after: bool,
                                                                         why: str) -> None:
    """The PEM reader trusted the first block and read past the rest: an entry showing (and commented with the id
    of) one key trusted another, hidden above it, and one key could sit unseen in two entries."""
    shown, hidden = generate().public(), generate().public()
    added = hidden.pem.strip() if extra == "other" else "not a key: see the runbook"
    pem = f"{shown.pem.strip()}\n{added}" if after else f"{added}\n{shown.pem.strip()}"
    body = "\n".join(f"      {line}" for line in pem.splitlines())
    entry = trusted_entry("ci-runners", shown).split("    public_key: |\n")[0] + f"    public_key: |\n{body}\n"
    (tmp_path / "config").mkdir()
    (tmp_path / "config/trusted-keys.yaml").write_text("keys:\n" + entry)
    with pytest.raises(UserError, match=f"config/trusted-keys.yaml:2 keys\\[0\\] {why}"):
        load_trusted(tmp_path)


@pytest.mark.parametrize("variable", ["XDG_CONFIG_HOME", "XDG_CACHE_HOME"])
def test_a_relative_xdg_folder_is_ignored_as_the_xdg_spec_says(monkeypatch, tmp_path: Path, variable: str) -> None:
    """`XDG_CONFIG_HOME=conf` put the dev signing key under ./conf of whatever folder the command ran in (the
    checkout, where it could be committed); the spec says a relative path is invalid and ignored."""
    from buildtool.attest.verdict_statement import dev_key_path
    from buildtool.common.files import cache_root

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(variable, "relative")
    found = dev_key_path() if variable == "XDG_CONFIG_HOME" else cache_root()
    default = tmp_path / "home" / (".config" if variable == "XDG_CONFIG_HOME" else ".cache")
    assert found.is_absolute() and found.is_relative_to(default), found
    monkeypatch.setenv(variable, str(tmp_path / "absolute"))
    found = dev_key_path() if variable == "XDG_CONFIG_HOME" else cache_root()
    assert found.is_relative_to(tmp_path / "absolute")


@pytest.mark.parametrize("name", ["2026", "1.0", "null", "yes", "true", "off", "~"])
def test_an_entry_for_a_name_yaml_reads_as_no_text_loads_under_that_name(tmp_path: Path, name: str) -> None:
    """`buildtool keys --name 2026` (or null, yes, 1.0) printed `- name: 2026`, which YAML reads as a number (a bool,
    null): the entry it told the user to paste was refused as having no name."""
    write(tmp_path, "keys:\n" + trusted_entry(name, CI.public()))
    assert load_trusted(tmp_path).names == {CI.public().keyid: name}


@pytest.mark.parametrize("name", ["ci-dev", "dev", "dev.2026"])
def test_keys_refuses_a_name_the_trusted_keys_file_would_refuse(run_cli, tmp_path: Path, name: str) -> None:
    """`keys --name ci-dev` made a key pair and printed an entry that the trusted-keys file then refused ("its name
    says it is a dev key"): the name is refused before any key is made."""
    code, out, err = run_cli("keys", "--name", name, "--out", str(tmp_path))
    assert code == 2 and f"--name {name!r}: the name says it is a dev key" in err, err
    assert list(tmp_path.iterdir()) == []
