"""A corpus of malformed matrices and command lines, each answered as a user needs it.

Every case: exit code 2, the exact first line of stderr (file:line, key, what to fix), no
traceback, nothing written (tests.conftest.snapshot), and an answer within a bound (an
alarm ends a hang as a failure; no time is asserted). The mutations start from the real
matrix.yaml, the way a user edits it; a second set checks that applying the advice a
message gives gets past that error.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from buildtool.matrix.loader import load_matrix
from buildtool.matrix.yamlsource import MAX_ALIAS_VALUES
from tests.conftest import FIXTURE_MATRIX, REPO, fixture_image_tests, snapshot

MATRIX = FIXTURE_MATRIX.read_text()
BOUND_S = 60  # a hang fails the test; answers are expected within a few seconds


@dataclass(frozen=True)
class Case:
    id: str
    expected: str                        # the exact first line of stderr
    old: str = ""                        # replaced once in the real matrix.yaml ...
    new: str = ""
    data: bytes | None = None            # ... or the whole file
    args: tuple[str, ...] = ("check", "--offline", "--matrix", "{matrix}")
    setup: Callable[[Path], dict[str, str] | None] | None = None
    env: tuple[tuple[str, str], ...] = ()
    # Lines named in `expected` as tokens (`<line>`, `<l2>`), each found by the text on that line
    # in the mutated matrix: after the mutation, or from the top with a leading `^`. So other work
    # on matrix.yaml moves no expectation, while every line number is still checked exactly.
    lines: tuple[tuple[str, str], ...] = ()


def _line_tokens(case: Case, text: str) -> dict[str, str]:
    start = MATRIX.index(case.old) if case.old else 0
    found = {}
    for token, anchor in case.lines:
        from_top = anchor.startswith("^")
        index = text.find(anchor.removeprefix("^"), 0 if from_top else start)
        assert index >= 0, f"{case.id}: {anchor!r} is not in the mutated matrix"
        found[token] = str(text.count("\n", 0, index) + 1)
    return found


def _bomb() -> bytes:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    return ("\n".join(lines) + "\n").encode()


def _template(rel: str, old: str, new: str, line_of: str) -> Callable[[Path], dict[str, str]]:
    """Edit a template; `<line>` in the expected message is the line of `line_of` after the edit
    (so other work on the templates does not move the expectation)."""
    def edit(root: Path) -> dict[str, str]:
        path = root / "templates" / rel
        text = path.read_text()
        assert old in text, (rel, old)
        text = text.replace(old, new, 1)
        path.write_text(text)
        return {"<line>": str(text[:text.index(line_of)].count("\n") + 1)}
    return edit


def _remove_user_part(root: Path) -> dict[str, str]:
    (root / "templates" / "parts" / "user.j2").unlink()
    text = (root / "templates" / "parts" / "image.j2").read_text()
    return {"<line>": str(text[:text.index('"parts/user.j2"')].count("\n") + 1)}


LONG_TAG = "{version}-" + "x" * 100 + "-{release}"

CASES = [
    # -- values that would have reached a shell (issue 9) -----------------------------------------
    Case("requirement-quote-injection",
         'error: matrix.yaml:<line>: images[2].versions[0].framework_requirements[0]: \'torch==2.13.0+cpu" && id && '
         'echo "\' is not a PEP 508 requirement (Expected comma (within version specifier), semicolon (after version '
         'specifier) or end); write it like torch==2.13.0',
         old='framework_requirements: ["torch==2.13.0+cpu"]',
         new='framework_requirements: [\'torch==2.13.0+cpu" && id && echo "\']',
         lines=(('<line>', 'framework_requirements: '),)),
    Case("package-version-command-substitution",
         "error: matrix.yaml:<line>: images[2].packages.torch-tb-profiler: '$(id)' is not a version (PEP 440, e.g. "
         '2.21.0)',
         old='torch-tb-profiler: "0.4.3"\n    versions:\n      - version: "2.13"',
         new='torch-tb-profiler: "$(id)"\n    versions:\n      - version: "2.13"',
         args=("render", "--matrix", "{matrix}"),
         lines=(('<line>', 'torch-tb-profiler: "$(id'),)),
    Case("requirement-backtick",
         "error: matrix.yaml:<line>: images[4].versions[0].framework_requirements[0]: 'tensorflow-cpu==2.21.0`id`' "
         'is not a PEP 508 requirement (Expected comma (within version specifier), semicolon (after version '
         'specifier) or end); write it like torch==2.13.0',
         old='framework_requirements: ["tensorflow-cpu==2.21.0"]',
         new='framework_requirements: ["tensorflow-cpu==2.21.0`id`"]',
         args=("plan", "--matrix", "{matrix}"),
         lines=(('<line>', 'framework_requirements: '),)),
    Case("index-url-and-and",
         "error: matrix.yaml:<line>: images[2].index.extra_urls[0]: 'https://download.pytorch.org/whl/cpu && id' "
         'contains a space; an index URL is a plain URL with no whitespace, quotes or shell metacharacters '
         '(percent-encode the character if the URL really has it)',
         old='extra_urls: ["https://download.pytorch.org/whl/cpu"]',
         new='extra_urls: ["https://download.pytorch.org/whl/cpu && id"]',
         lines=(('<line>', 'extra_urls: ["https://do'),)),
    Case("package-name-command-substitution",
         "error: matrix.yaml:<line>: defaults.packages.tensorboard$(id): 'tensorboard$(id)' is not a package name "
         "(letters, digits, '.', '_' and '-', starting and ending with a letter or digit)",
         old='    tensorboard: "2.21.0"',
         new='    tensorboard$(id): "2.21.0"',
         args=("plan", "--json", "--matrix", "{matrix}"),
         lines=(('<line>', 'tensorboard$(id): "2.21.'),)),
    Case("framework-version-injection",
         "error: matrix.yaml:<line>: images[2].versions[0].framework_version: '2.13.0+cpu\\nRUN id' is not a version "
         '(PEP 440, e.g. 2.21.0)',
         old='framework_version: 2.13.0+cpu',
         new='framework_version: "2.13.0+cpu\\nRUN id"',
         args=("render", "--matrix", "{matrix}"),
         lines=(('<line>', 'framework_version: "2.13'),)),
    Case("use-with-line-break",
         'error: matrix.yaml:<line>: images[4].use: contains a line break; write one line of plain text',
         old='    use: TensorFlow on CPU for laptops',
         new='    use: "TensorFlow\\nRUN id" # for laptops',
         args=("catalogue", "--matrix", "{matrix}"),
         lines=(('<line>', 'use: "TensorFlow\\nRUN id'),)),
    # -- base references --------------------------------------------------------------------------
    Case("base-with-space",
         "error: matrix.yaml:<line>: images[0].versions[0].base: 'nvcr.io/nvidia/pytorch 25.10-py3' contains "
         'whitespace; an image reference is one word like nvcr.io/nvidia/pytorch:25.10-py3',
         old='base: nvcr.io/nvidia/pytorch:25.10-py3',
         new='base: nvcr.io/nvidia/pytorch 25.10-py3',
         lines=(('<line>', 'base: nvcr.io/nvidia/pyt'),)),
    Case("base-uppercase-repository",
         "error: matrix.yaml:<line>: images[0].versions[0].base: 'nvcr.io/nvidia/PyTorch:25.10-py3': repository part "
         "'PyTorch' is not valid (repository names are lower case); use lower-case letters, digits and single "
         "separators ('.', '_', '__', '-')",
         old='base: nvcr.io/nvidia/pytorch:25.10-py3',
         new='base: nvcr.io/nvidia/PyTorch:25.10-py3',
         lines=(('<line>', 'base: nvcr.io/nvidia/PyT'),)),
    Case("base-empty-tag",
         "error: matrix.yaml:<line>: images[0].versions[1].base: 'nvcr.io/nvidia/pytorch:' ends its name with ':' "
         "but names no tag; add the tag or remove the ':'",
         old='base: nvcr.io/nvidia/pytorch:25.01-py3',
         new='base: "nvcr.io/nvidia/pytorch:"',
         lines=(('<line>', 'base: "nvcr.io/nvidia/py'),)),
    Case("base-empty-tag-unquoted",
         'error: matrix.yaml:<line>: YAML syntax: mapping values are not allowed in this context; quote a value that '
         "contains ': ' or ends with ':'",
         old='base: nvcr.io/nvidia/pytorch:25.01-py3',
         new='base: nvcr.io/nvidia/pytorch:',
         lines=(('<line>', 'base: nvcr.io/nvidia/pyt'),)),
    Case("quote-inside-single-quotes",
         'error: matrix.yaml:<line>: YAML syntax: did not find expected key (while parsing a block mapping); text '
         "follows a closing quote: quote the whole value (inside '...' write '' for a ')",
         old="    use: PyTorch with PyPI's CUDA wheels",
         new="    use: 'PyTorch with PyPI's CUDA wheels",
         lines=(('<line>', "use: 'PyTorch with PyPI'"),)),
    Case("value-starting-with-at",
         'error: matrix.yaml:<line>: YAML syntax: found character that cannot start any token (while scanning for '
         'the next token); quote a value that starts with @, `, %, ! or &',
         old='      - version: "2.13"\n        default: true\n        framework_version: 2.13.0\n',
         new='      - version: "2.13"\n        default: true\n        framework_version: @2.13.0\n',
         lines=(('<line>', 'framework_version: @2.13'),)),
    Case("base-without-tag",
         "error: matrix.yaml:<line>: images[1].versions[0].base: 'nvcr.io/nvidia/tensorflow' names no tag or digest; "
         'pin it, e.g. nvcr.io/nvidia/tensorflow:TAG or nvcr.io/nvidia/tensorflow@sha256:DIGEST',
         old='base: nvcr.io/nvidia/tensorflow:25.02-tf2-py3',
         new='base: nvcr.io/nvidia/tensorflow',
         args=("workflows", "write", "--matrix", "{matrix}"),
         lines=(('<line>', 'base: nvcr.io/nvidia/ten'),)),
    Case("standin-base-bad-digest",
         "error: matrix.yaml:<line>: images[0].standin.base: 'docker.io/library/debian@sha256:abc': digest "
         "'sha256:abc' is not algorithm:hex (e.g. sha256:<64 hex digits>)",
         old='      base: docker.io/library/debian:bookworm-slim\n      requirements: ["torch',
         new='      base: docker.io/library/debian@sha256:abc\n      requirements: ["torch',
         lines=(('<line>', 'base: docker.io/library/'),)),
    # -- tags -------------------------------------------------------------------------------------
    Case("release-tag-unknown-placeholder",
         'error: matrix.yaml:<line>: defaults.release.tags[0]: unknown placeholder {nope} in tag template '
         "'{version}-{nope}'; use {version} and {release}",
         old='tags: ["{version}-{release}"]',
         new='tags: ["{version}-{nope}"]',
         args=("plan", "--matrix", "{matrix}"),
         lines=(('<line>', 'tags: ["{version}-{nope}'),)),
    Case("release-tag-with-slash",
         "error: matrix.yaml:<line>: defaults.release.tags[0]: tag template '{version}/{release}' renders to "
         "'25.10/2026.12.31.post999.dev999', which is not a Docker tag (letters, digits, '_', '.', '-'; not starting "
         "with '.' or '-'; no '/', ':' or spaces)",
         old='tags: ["{version}-{release}"]',
         new='tags: ["{version}/{release}"]',
         lines=(('<line>', 'tags: ["{version}/{relea'),)),
    Case("release-tag-too-long",
         'error: matrix.yaml:<line>: defaults.release.tags[0]: tag template '
         "'{version}-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
         "xxxxxxxxxxxx-{release}' renders to 132 characters for version 25.10 with {release} as long as "
         "'2026.12.31.post999.dev999' (the longest plausible release); a Docker tag has at most 128",
         old='tags: ["{version}-{release}"]',
         new=f'tags: ["{LONG_TAG}"]',
         lines=(('<line>', 'tags: ["{version}-xxxxxx'),)),
    Case("release-tag-typo-placeholder",
         'error: matrix.yaml:<line>: defaults.release.moving[0]: unknown placeholder {verison} in tag template '
         "'{verison}'; use {version} and {release}; did you mean `version`?",
         old='moving: ["{version}"] ',
         new='moving: ["{verison}"] ',
         lines=(('<line>', 'moving: ["{verison}"]   '),)),
    Case("moving-tag-on-two-versions",
         "error: matrix.yaml:<line>: images[0].versions[1].release.moving[0]: tag template 'latest' gives 'latest', "
         'also a tag of pytorch-ngc:25.10 (line <l2>); a tag names one cell, so keep it on one version',
         old='        framework_version: 2.6.0a0\n',
         new='        framework_version: 2.6.0a0\n        release:\n          moving: [latest]\n',
         lines=(('<line>', 'moving: [latest]'), ('<l2>', '^moving: ["{version}", la'),)),
    # -- defaults ---------------------------------------------------------------------------------
    Case("no-default-version",
         'error: matrix.yaml:<line>: images[4]: no version of tensorflow-cpu has `default: true`; set it on exactly '
         'one (the version `latest` and the nightly jobs use)',
         old='        default: true\n        framework_version: 2.21.0',
         new='        framework_version: 2.21.0',
         lines=(('<line>', '^- name: tensorflow-cpu'),)),
    Case("two-default-versions",
         'error: matrix.yaml:<line>: images[1].versions[1].default: a second version of tensorflow-ngc with '
         '`default: true` (the first is 25.02, line <l2>); keep one',
         old='      - version: "25.01"\n        base: nvcr.io/nvidia/tensorflow',
         new='      - version: "25.01"\n        default: true\n        base: nvcr.io/nvidia/tensorflow',
         lines=(('<line>', 'default: true'),
                ('<l2>', '^default: true\n        base: nvcr.io/nvidia/tensorflow:25.02'))),
    Case("default-on-the-image",
         'error: matrix.yaml:<line>: images[2].default: unknown key `default`; `default` belongs on one entry under '
         '`versions:` (`default: true`)',
         old='    framework: pytorch\n    accelerator: cpu\n',
         new='    framework: pytorch\n    accelerator: cpu\n    default: true\n',
         lines=(('<line>', 'default: true'),)),
    # -- templates --------------------------------------------------------------------------------
    Case("template-outside-relative",
         "error: matrix.yaml:<line>: images[0].template: '../../etc/passwd' is not a path inside templates/ "
         "(relative, no '..', e.g. images/pip.Dockerfile.j2)",
         old='template: images/ngc.Dockerfile.j2',
         new='template: ../../etc/passwd',
         lines=(('<line>', 'template: ../../etc/pass'),)),
    Case("template-outside-absolute",
         "error: matrix.yaml:<line>: images[0].template: '/etc/passwd' is not a path inside templates/ (relative, no "
         "'..', e.g. images/pip.Dockerfile.j2)",
         old='template: images/ngc.Dockerfile.j2',
         new='template: /etc/passwd',
         lines=(('<line>', 'template: /etc/passwd'),)),
    Case("template-missing-suggests",
         "error: matrix.yaml:<line>: images[2].template: template 'images/pipp.Dockerfile.j2' not found "
         'under templates/; did you mean `images/pip.Dockerfile.j2`?',
         old='template: images/pip.Dockerfile.j2',
         new='template: images/pipp.Dockerfile.j2',
         lines=(('<line>', 'template: images/pipp'),)),
    Case("template-syntax-error",
         "error: templates/parts/labels.j2:4: unexpected '}'",
         setup=_template("parts/labels.j2", "{{ cell.name | label }}", "{{ cell.name | label }", "{{ cell.name"),
         args=("render", "--matrix", "{matrix}")),
    Case("template-runtime-error",
         'error: templates/parts/user.j2:3: TypeError: can only concatenate tuple (not "int") to tuple (cell '
         'pytorch-ngc:25.10); fix the template',
         setup=_template("parts/user.j2", "RUN mkdir", "{{ cell.tests + 1 }}\nRUN mkdir", "{{ cell.tests + 1")),
    Case("template-unknown-filter",
         "error: templates/parts/python.j2:44: No filter named 'shell'.",
         setup=_template("parts/python.j2", "{{ pin | sh }}", "{{ pin | shell }}", "pin | shell")),
    Case("template-includes-missing-part",
         "error: templates/parts/image.j2:14: includes missing template 'parts/user.j2' (cell pytorch-ngc:25.10)",
         setup=_remove_user_part,
         args=("render", "--matrix", "{matrix}")),
    # -- run profile ------------------------------------------------------------------------------
    Case("shm-size-negative",
         'error: matrix.yaml:<line>: defaults.run.shm_size: -1 is not a size; write a size of at least 1g for '
         '/dev/shm, e.g. shm_size: 8g (there is no unlimited /dev/shm)',
         old='    shm_size: 8g\n',
         new='    shm_size: -1\n',
         lines=(('<line>', 'shm_size: -1'),)),
    Case("shm-size-below-minimum",
         'error: matrix.yaml:<line>: defaults.run.shm_size: 256m is below the 1g of /dev/shm the image checks need '
         '(DataLoader workers, NCCL); write at least shm_size: 1g, e.g. shm_size: 8g',
         old='    shm_size: 8g\n',
         new='    shm_size: "256m"\n',
         lines=(('<line>', 'shm_size: "256m"'),)),
    Case("shm-size-docker-units",
         "error: matrix.yaml:<line>: defaults.run.shm_size: '8GB' is not a size; write it like shm_size: 8g (a whole "
         'number with k, m or g)',
         old='    shm_size: 8g\n',
         new='    shm_size: 8GB\n',
         lines=(('<line>', 'shm_size: 8GB'),)),
    Case("ulimit-unlimited-word",
         'error: matrix.yaml:<line>: images[0].run.ulimits.memlock: must be a whole number (-1 for unlimited); got '
         "'unlimited'; write -1 for unlimited",
         old='        memlock: -1\n    tests: [common, pytorch]\n    use: Default',
         new='        memlock: unlimited\n    tests: [common, pytorch]\n    use: Default',
         lines=(('<line>', 'memlock: unlimited'),)),
    Case("ulimit-misspelt",
         'error: matrix.yaml:<line>: defaults.run.ulimits.stakc: unknown key `stakc`; did you mean `stack`? (one of '
         'memlock, stack, nofile, nproc, core, fsize, cpu, as, data, rss, rtprio, sigpending)',
         old='      stack: 67108864\n',
         new='      stakc: 67108864\n',
         lines=(('<line>', 'stakc: 67108864'),)),
    Case("gpus-yes",
         "error: matrix.yaml:<line>: defaults.run.gpus: Input should be 'none' or 'all' (got True); YAML reads yes, "
         'no, on and off as true/false',
         old='    gpus: all\n',
         new='    gpus: yes\n',
         lines=(('<line>', 'gpus: yes'),)),
    Case("run-key-at-image-level",
         'error: matrix.yaml:<line>: images[2].shm_size: unknown key `shm_size`; `shm_size` belongs under `run:`',
         old='    tests: [common, pytorch]\n    use: PyTorch on CPU',
         new='    shm_size: 16g\n    tests: [common, pytorch]\n    use: PyTorch on CPU',
         lines=(('<line>', 'shm_size: 16g'),)),
    # -- keys and types ---------------------------------------------------------------------------
    Case("versions-misspelt",
         'error: matrix.yaml:<line>: images[2].verisons: unknown key `verisons`; did you mean `versions`?',
         old='    versions:\n      - version: "2.13"\n        default: true\n        framework_version: 2.13.0+cpu',
         new='    verisons:\n      - version: "2.13"\n        default: true\n        framework_version: 2.13.0+cpu',
         lines=(('<line>', 'verisons:'),)),
    Case("framework-version-misspelt",
         'error: matrix.yaml:<line>: images[1].versions[0].framework_verison: unknown key `framework_verison`; did '
         'you mean `framework_version`?',
         old='        framework_version: 2.17.0\n        release:',
         new='        framework_verison: 2.17.0\n        release:',
         lines=(('<line>', 'framework_verison: 2.17.'),)),
    Case("python-unquoted",
         'error: matrix.yaml:<line>: defaults.python: must be a string; quote it: python: "3.10"',
         old='  python: "3.11"',
         new='  python: 3.10',
         lines=(('<line>', 'python: 3.10'),)),
    Case("package-version-unquoted",
         'error: matrix.yaml:<line>: defaults.packages.tensorboard: must be a string; quote it: tensorboard: "2.21"',
         old='    tensorboard: "2.21.0"',
         new='    tensorboard: 2.21',
         lines=(('<line>', 'tensorboard: 2.21'),)),
    Case("tests-not-a-list",
         'error: matrix.yaml:<line>: images[4].tests: must be a list; write tests: [tensorflow]',
         old='    tests: [common, tensorflow]\n    use: TensorFlow on CPU',
         new='    tests: tensorflow\n    use: TensorFlow on CPU',
         lines=(('<line>', 'tests: tensorflow'),)),
    Case("apt-package-bad-name",
         "error: matrix.yaml:<line>: images[4].apt_packages[0]: 'Curl' is not a Debian package name (lower-case "
         "letters, digits, '+', '-' and '.', at least two characters; optionally =VERSION)",
         old='    run:\n      gpus: none\n    packages:\n      tensorboard-plugin-profile',
         new='    apt_packages: [Curl]\n    run:\n      gpus: none\n    packages:\n      tensorboard-plugin-profile',
         lines=(('<line>', 'apt_packages: [Curl]'),)),
    Case("index-url-credentials",
         'error: matrix.yaml:<line>: images[2].index.extra_urls[0]: '
         "'https://download.pytorch.org/whl/cpu' carries credentials; never put them in the matrix: the "
         "host's pip configuration supplies them to builds as secrets",
         old='extra_urls: ["https://download.pytorch.org/whl/cpu"]',
         new='extra_urls: ["https://user:secret@download.pytorch.org/whl/cpu"]',
         lines=(('<line>', 'extra_urls: ["https://us'),)),
    Case("index-url-ftp",
         "error: matrix.yaml:<line>: images[2].index.extra_urls[0]: 'ftp://download.pytorch.org/whl/cpu': an index "
         'URL must start with https://, http:// or file://',
         old='extra_urls: ["https://download.pytorch.org/whl/cpu"]',
         new='extra_urls: ["ftp://download.pytorch.org/whl/cpu"]',
         lines=(('<line>', 'extra_urls: ["ftp://down'),)),
    Case("same-package-twice",
         "error: matrix.yaml:<line>: images[0].packages.torch_tb_profiler: 'torch_tb_profiler' is the same package "
         "as 'torch-tb-profiler' (names compare without case, '-', '_' or '.'); keep one",
         old='      torch-tb-profiler: "0.4.3"\n    standin:',
         new='      torch-tb-profiler: "0.4.3"\n      torch_tb_profiler: "0.4.3"\n    standin:',
         lines=(('<line>', 'torch_tb_profiler: "0.4.'),)),
    Case("requirement-disagrees-with-framework-version",
         "error: matrix.yaml:<line>: images[3].versions[0].framework_requirements[0]: 'torch==2.12.0' does not "
         'install framework_version 2.13.0 (line <l2>); make the two agree',
         old='framework_requirements: ["torch===2.13.0"]',
         new='framework_requirements: ["torch==2.12.0"]',
         lines=(('<line>', 'framework_requirements: '), ('<l2>', '^framework_version: 2.13.0\n'))),
    Case("standin-requirement-unpinned",
         "error: matrix.yaml:<line>: images[1].standin.requirements[0]: 'tensorflow-cpu' names no version; pin one, "
         'e.g. tensorflow-cpu==1.0',
         old='requirements: ["tensorflow-cpu==2.21.0"]',
         new='requirements: ["tensorflow-cpu"]',
         lines=(('<line>', 'requirements: ["tensorfl'),)),
    Case("standin-workdir-relative",
         "error: matrix.yaml:<line>: images[0].standin.workdir: 'workspace' is not an absolute path like /workspace "
         "(letters, digits, '.', '_', '-', '/')",
         old='      requirements: ["torch==2.13.0+cpu"]\n',
         new='      requirements: ["torch==2.13.0+cpu"]\n      workdir: workspace\n',
         lines=(('<line>', 'workdir: workspace'),)),
    Case("source-not-a-url",
         "error: matrix.yaml:<line>: source: 'github.com/dl-images': the source must start with https:// or http://",
         old='source: https://github.com/dl-images/dl-images',
         new='source: github.com/dl-images',
         lines=(('<line>', 'source: github.com/dl-im'),)),
    Case("use-too-long",
         'error: matrix.yaml:<line>: images[4].use: is 443 characters; keep it to at most 300',
         old='    use: TensorFlow on CPU for laptops',
         new="    use: " + "very " * 70 + "long; for laptops",
         lines=(('<line>', 'use: very very very very'),)),
    Case("empty-versions",
         'error: matrix.yaml:<line>: images[4].versions: is empty; list at least one entry',
         old='    versions:\n      - version: "2.21"\n        default: true\n        framework_version: 2.21.0\n     '
             '   framework_requirements: ["tensorflow-cpu==2.21.0"]\n        release:\n          moving: '
             '["{version}", latest]\n',
         new='    versions: []\n',
         lines=(('<line>', 'versions: []'),)),
    Case("image-is-a-string",
         "error: matrix.yaml:<line>: images[3]: must be a mapping (`key: value` lines), not 'pytorch-cuda'",
         old='  - name: pytorch-cuda\n',
         new='  - pytorch-cuda\n  - name: pytorch-cuda2\n',
         lines=(('<line>', '- pytorch-cuda'),)),
    Case("schema-true",
         'error: matrix.yaml:<line>: schema: must be 1, the matrix format this buildtool reads; got True',
         old='schema: 1',
         new='schema: true',
         lines=(('<line>', 'schema: true'),)),
    Case("accelerator-gpu",
         "error: matrix.yaml:<line>: images[2].accelerator: Input should be 'cpu' or 'cuda' (got 'gpu'); did you "
         'mean `cuda`?',
         old='    framework: pytorch\n    accelerator: cpu\n',
         new='    framework: pytorch\n    accelerator: gpu\n',
         lines=(('<line>', 'accelerator: gpu'),)),
    Case("ipc-capitalised",
         "error: matrix.yaml:<line>: defaults.run.ipc: Input should be 'private', 'host' or 'shareable' (got "
         "'Host'); did you mean `host`?",
         old='    ipc: private\n',
         new='    ipc: Host\n',
         lines=(('<line>', 'ipc: Host'),)),
    Case("pip-template-without-requirements",
         'error: matrix.yaml:<line>: images[4].versions[0].framework_requirements: template '
         'images/pip.Dockerfile.j2 needs framework_requirements (its first line says so); set it in '
         'defaults, the image or this version, e.g. framework_requirements: ["tensorflow==2.21.0"]',
         old='        framework_requirements: ["tensorflow-cpu==2.21.0"]\n',
         new='',
         lines=(('<line>', '^- version: "2.21"'),)),
    Case("immutable-tag-without-release",
         "error: matrix.yaml:<line>: defaults.release.tags[0]: immutable tag template '{version}' has no {release}, "
         'so a second release would need to move it; add {release} or list it under moving',
         old='tags: ["{version}-{release}"]',
         new='tags: ["{version}"]',
         lines=(('<line>', 'tags: ["{version}"]     '),)),
    Case("no-immutable-tag",
         'error: matrix.yaml:<line>: defaults.release.tags: lists no immutable tag; keep at least one, e.g. tags: '
         '["{version}-{release}"]',
         old='tags: ["{version}-{release}"]',
         new='tags: []',
         lines=(('<line>', 'tags: []     # immutable'),)),
    Case("mapping-key-given-a-value",
         'error: matrix.yaml:<line>: YAML syntax: `run` has a value on this line and an indented block under it; '
         "keep one of the two (a mapping's keys go on the lines below, with nothing after the colon)",
         old='  run:\n    shm_size: 8g\n',
         new='  run: 8g\n    shm_size: 8g\n',
         lines=(('<line>', 'run: 8g'),)),
    Case("required-key-empty",
         'error: matrix.yaml:<line>: source: is empty; give it a value',
         old='source: https://github.com/dl-images/dl-images',
         new='source:',
         lines=(('<line>', 'source:'),)),
    # An empty value in a layer silently took the layer above's (python: a version's 3.12 became defaults' 3.11),
    # where an empty package or ulimit was refused: every layer key and every key of its mappings refuses it too.
    Case("layer-key-null",
         'error: matrix.yaml:<line>: images[0].versions[0].python: is empty; give it a value or remove the line',
         old='        python: "3.12"\n',
         new='        python:\n',
         lines=(('<line>', 'python:'),)),
    Case("layer-mapping-key-null",
         'error: matrix.yaml:<line>: images[0].validate.deadline_s: is empty; give it a value or remove the line',
         old='      deadline_s: 1500\n',
         new='      deadline_s:\n',
         lines=(('<line>', 'deadline_s:'),)),
    Case("layer-mapping-null",
         'error: matrix.yaml:<line>: defaults.packages: is empty; give it a value or remove the line',
         old='  packages:\n    tensorboard: "2.21.0"\n',
         new='  packages:\n',
         lines=(('<line>', 'packages:'),)),
    Case("version-missing",
         'error: matrix.yaml:<line>: images[4].versions[0].version: required key is missing',
         old='      - version: "2.21"\n        default: true\n',
         new='      - default: true\n',
         lines=(('<line>', '- default: true'),)),
    # -- YAML itself ------------------------------------------------------------------------------
    Case("unclosed-flow-list",
         "error: matrix.yaml:<line>: YAML syntax: did not find expected ',' or ']' (while parsing a flow sequence "
         'opened here; noticed on line <l2>)',
         old='  tests: [common]\n',
         new='  tests: [common\n',
         lines=(('<line>', 'tests: [common'), ('<l2>', 'packages:'),)),
    Case("unclosed-quote",
         'error: matrix.yaml:<line>: YAML syntax: a quote opens here and does not close on this line (YAML fails on '
         'line <l2>: did not find expected key); close the quote',
         old='  python: "3.11"',
         new='  python: "3.11',
         lines=(('<line>', 'python: "3.11'), ('<l2>', 'tensorboard: "2.21.0"'),)),
    Case("tab-indent",
         'error: matrix.yaml:<line>: YAML syntax: found a tab character that violates indentation (while scanning a '
         'plain scalar); indent with spaces, not tabs',
         old='    ipc: private\n',
         new='\tipc: private\n',
         lines=(('<line>', 'ipc: private'),)),
    Case("duplicate-key",
         'error: matrix.yaml:<line>: defaults.run.gpus: duplicate key (already set on line <l2>); keep one',
         old='    gpus: all\n',
         new='    gpus: all\n    gpus: none\n',
         lines=(('<line>', 'gpus: none'), ('<l2>', 'gpus: all'),)),
    Case("python-object-tag",
         'error: matrix.yaml:<line>: schema: YAML tag tag:yaml.org,2002:python/object/apply:os.system is not '
         'supported here; remove it',
         old='schema: 1',
         new='schema: !!python/object/apply:os.system [id]',
         lines=(('<line>', 'schema: !!python/object/'),)),
    Case("non-utf8-byte",
         'error: matrix.yaml:<line>: not UTF-8 text (byte 0xb4 at column 64); save the file as UTF-8',
         data=MATRIX.replace("NVIDIA's NGC stack", "NVIDIA\xb4s NGC stack").encode("latin-1"),
         lines=(('<line>', 'use: Default PyTorch ima'),)),
    Case("nul-byte",
         'error: matrix.yaml:<line>: control character U+0000 at column 8; YAML text has none (is this a binary '
         'file?)',
         data=MATRIX.replace("source:", "source:\x00").encode(),
         lines=(('<line>', 'source:\x00 https://github.'),)),
    Case("binary-junk",
         'error: matrix.yaml:2: not UTF-8 text (byte 0x80 at column 118); save the file as UTF-8',
         data=bytes(range(256)) * 64),
    Case("empty-file",
         'error: matrix.yaml:1: the file is empty; declare `images:`',
         data=b""),
    Case("only-comments",
         'error: matrix.yaml:1: the file is empty; declare `images:`',
         data=b"# nothing here yet\n"),
    Case("alias-bomb",
         'error: matrix.yaml:5: e[0]: YAML aliases expand to more than 10000 values (an alias bomb?); write the '
         'values out or set them in `defaults`',
         data=_bomb()),
    Case("recursive-alias",
         'error: matrix.yaml:2: images[0]: alias *x refers to a value that contains it; a value cannot include itself',
         data=b"schema: 1\nimages: &x [*x]\n"),
    Case("deep-nesting",
         'error: matrix.yaml:2: '
         'images[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]: '
         'nested more than 32 levels deep; the matrix needs at most 8',
         data=b"schema: 1\nimages: " + b"[" * 50000 + b"]" * 50000 + b"\n"),
    Case("two-documents",
         'error: matrix.yaml:<line>: a second YAML document (`---`); the matrix is one document',
         data=MATRIX.encode() + b"---\nschema: 1\n",
         lines=(('<line>', '---'),)),
    Case("top-level-list",
         'error: matrix.yaml:1: the top level must be a mapping with `schema`, `source` and `images`',
         data=b"- schema: 1\n"),
    # -- command lines ----------------------------------------------------------------------------
    Case("matrix-is-a-directory",
         'error: templates: is a directory; pass the matrix file itself, e.g. --matrix templates/matrix.yaml',
         args=("plan", "--matrix", "{root}/templates")),
    Case("release-matrix-is-a-directory",
         'error: templates: is a directory; pass the matrix file itself, e.g. --matrix templates/matrix.yaml',
         args=("release", "--version", "0.1.0", "--matrix", "{root}/templates")),
    Case("release-matrix-is-a-fifo",
         'error: pipe.yaml: is not a regular file (<root>/pipe.yaml is a device, pipe or socket); pass the matrix '
         'file',
         args=("release", "--version", "0.1.0", "--matrix", "{root}/pipe.yaml"),
         setup=lambda root: os.mkfifo(root / "pipe.yaml")),
    Case("matrix-missing",
         'error: matrx.yaml: file not found; pass --matrix or create it',
         args=("render", "--matrix", "{root}/matrx.yaml")),
    Case("matrix-is-a-fifo",
         'error: pipe.yaml: is not a regular file (<root>/pipe.yaml is a device, pipe or socket); pass the matrix '
         'file',
         args=("check", "--matrix", "{root}/pipe.yaml"),
         setup=lambda root: os.mkfifo(root / "pipe.yaml")),
    Case("registry-setting-with-space",
         "error: REGISTRY='my registry:5000' is not a registry host[:port] with an optional path, e.g. "
         '127.0.0.1:5000 or ghcr.io/team',
         args=("plan", "--revision", "0123456789ab", "--matrix", "{matrix}"),
         env=(("REGISTRY", "my registry:5000"),)),
    Case("registry-setting-with-credentials-never-shows-them",
         "error: REGISTRY='***@ghcr.io/team' is not a registry host[:port] with an optional path, e.g. "
         '127.0.0.1:5000 or ghcr.io/team',
         args=("plan", "--revision", "0123456789ab", "--matrix", "{matrix}"),
         env=(("REGISTRY", "robot:s3cr3t@ghcr.io/team"),)),
    Case("base-mirror-with-credentials-never-shows-them",
         "error: BASE_MIRROR='***@mirror.example' is not a registry host[:port] with an optional path, e.g. "
         '127.0.0.1:5000 or ghcr.io/team',
         args=("plan", "--revision", "0123456789ab", "--matrix", "{matrix}"),
         env=(("BASE_MIRROR", "robot:s3cr3t@mirror.example"),)),
    Case("release-option-not-a-tag",
         "error: --release '0.1/beta' gives the tag '25.10-0.1/beta', which is not a Docker tag; use a version like "
         '0.1.0',
         args=("plan", "--release", "0.1/beta", "--revision", "0123456789ab", "--matrix", "{matrix}")),
    # Its normal form (1-1 is 1.post1) is longer: the plan gave a tag of 131 characters (none before).
    Case("release-option-whose-normal-form-is-no-tag",
         "error: --release '{0}' (as {1}, its PEP 440 normal form) gives the tag '25.10-{1}', which is not a "
         "Docker tag; use a version like 0.1.0".format("1." * 59 + "1-1", "1." * 59 + "1.post1"),
         args=("plan", "--release", "1." * 59 + "1-1", "--revision", "0123456789ab", "--matrix", "{matrix}")),
    Case("framework-unknown-suggests",
         "error: unknown FRAMEWORK='pytorch_cpu'; choose one of: all, pytorch, tensorflow, pytorch-ngc, "
         'tensorflow-ngc, pytorch-cpu, pytorch-cuda, tensorflow-cpu; did you mean `pytorch-cpu`?',
         args=("plan", "--framework", "pytorch_cpu", "--matrix", "{matrix}")),
    Case("framework-unknown-version",
         "error: unknown FRAMEWORK='pytorch-cpu:2.12'; choose one of: all, pytorch, tensorflow, pytorch-ngc, "
         'tensorflow-ngc, pytorch-cpu, pytorch-cuda, tensorflow-cpu; pytorch-cpu has version(s) 2.13',
         args=("plan", "--json", "-f", "pytorch-cpu:2.12", "--matrix", "{matrix}")),
    Case("framework-empty-version",
         "error: unknown FRAMEWORK='tensorflow-cpu:'; choose one of: all, pytorch, tensorflow, pytorch-ngc, "
         'tensorflow-ngc, pytorch-cpu, pytorch-cuda, tensorflow-cpu; tensorflow-cpu has version(s) 2.21',
         args=("build", "-f", "tensorflow-cpu:", "--matrix", "{matrix}")),
]


@pytest.fixture
def bounded() -> Iterator[None]:
    """A hang becomes a failure after BOUND_S instead of stalling the suite."""
    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"no answer within {BOUND_S}s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(BOUND_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _prepare(project: Path, case: Case) -> tuple[Path, dict[str, str]]:
    matrix = project / "matrix.yaml"
    if case.data is not None:
        matrix.write_bytes(case.data)
    elif case.old:
        text = matrix.read_text()
        assert case.old in text, f"fixture text {case.old!r} no longer in matrix.yaml"
        matrix.write_text(text.replace(case.old, case.new, 1))
    found = (case.setup(project) if case.setup is not None else None) or {}
    if case.lines:
        found.update(_line_tokens(case, matrix.read_bytes().decode("latin-1")))
    # Stale outputs: a command that went ahead would visibly write.
    (project / "docs" / "images.md").write_text("stale\n")
    return matrix, {"<root>": str(project), **found}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_corpus_case(project: Path, run_cli, bounded, case: Case, monkeypatch: pytest.MonkeyPatch):
    for name, value in case.env:
        monkeypatch.setenv(name, value)
    matrix, fill = _prepare(project, case)
    before = snapshot(project)
    args = [a.format(matrix=matrix, root=project) for a in case.args]
    code, out, err = run_cli(*args)
    assert "Traceback" not in out + err
    first = err.strip().splitlines()[0] if err.strip() else ""
    if os.environ.get("RECORD_CORPUS"):
        print(f"\nRECORD {case.id}\t{first}")
    assert code == 2, err
    expected = case.expected
    for token, value in fill.items():
        expected = expected.replace(token, value)
    assert first == expected
    assert snapshot(project) == before


def test_corpus_is_large_enough():
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)


def test_unreadable_matrix(project: Path, run_cli, bounded, monkeypatch: pytest.MonkeyPatch):
    """Root reads any file, so the permission error is raised where the file is opened."""
    matrix = project / "matrix.yaml"
    real_open = Path.open

    def refuse(self: Path, *args, **kwargs):
        if self == matrix:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    before = snapshot(project)
    monkeypatch.setattr(Path, "open", refuse)
    code, _, err = run_cli("check", "--offline", "--matrix", str(matrix))
    monkeypatch.undo()
    assert code == 2
    assert err.strip() == ("error: matrix.yaml: cannot read it (Permission denied); pass a readable matrix file "
                           "with --matrix")
    assert snapshot(project) == before


def test_alias_bound_is_small_but_real_aliases_work(tmp_path: Path):
    """Anchors, aliases and merge keys a user writes to share values still load."""
    text = MATRIX.replace("  run:\n    shm_size: 8g\n", "  run: &run\n    shm_size: 8g\n", 1)
    text = text.replace("    run:\n      gpus: none\n    index:",
                        "    run:\n      <<: *run\n      gpus: none\n    index:", 1)
    (tmp_path / "matrix.yaml").write_text(text)
    cells = {c.key: c for c in load_matrix(tmp_path / "matrix.yaml", REPO / "templates",
                                           tests_dir=fixture_image_tests()).cells}
    assert cells["pytorch-cpu:2.13"].run.gpus == "none"
    assert cells["pytorch-cpu:2.13"].run.shm_size == "8g"
    assert MAX_ALIAS_VALUES <= 100_000


# -- advice that works: apply what the message says, and that error is gone ---------------------------

def _apply(text: str, message: str) -> str:
    """Apply the fix a one-line message proposes to the line it names."""
    line_no = int(re.match(r"^error: matrix\.yaml:(\d+): ", message).group(1))
    lines = text.split("\n")
    line = lines[line_no - 1]
    if m := re.search(r"unknown key `([^`]+)`; did you mean `([^`]+)`\?", message):
        lines[line_no - 1] = line.replace(m.group(1), m.group(2), 1)
    elif m := re.search(r"(?:quote it: |write it like |write at least |write |e\.g\. )"
                        r"([a-z_]+): (.+?)(?= \(|, e\.g\.|;|$)", message):
        key, value = m.group(1), m.group(2)
        lines[line_no - 1] = re.sub(rf"{key}:.*$", f"{key}: {value}", line)
    elif m := re.search(r"unknown placeholder (\{[^}]*\}).*did you mean `([^`]+)`", message):
        lines[line_no - 1] = line.replace(m.group(1), "{" + m.group(2) + "}", 1)
    elif "did you mean" in message:
        wrong = re.search(r"'([^']+)'", message).group(1)
        right = re.search(r"did you mean `([^`]+)`", message).group(1)
        lines[line_no - 1] = line.replace(wrong, right, 1)
    elif "keep one" in message:
        del lines[line_no - 1]
    elif "set it on exactly one" in message:
        index = next(i for i in range(line_no, len(lines)) if lines[i].strip().startswith("- version:"))
        lines.insert(index + 1, " " * (lines[index].index("-") + 2) + "default: true")
    else:
        raise AssertionError(f"no advice to apply in {message!r}")
    return "\n".join(lines)


ADVICE = [c for c in CASES if c.id in {
    "versions-misspelt", "framework-version-misspelt", "python-unquoted", "package-version-unquoted",
    "tests-not-a-list", "shm-size-negative", "shm-size-below-minimum", "shm-size-docker-units",
    "two-default-versions", "no-default-version", "duplicate-key", "same-package-twice",
    "release-tag-typo-placeholder", "template-missing-suggests", "ulimit-misspelt",
}]


# Cases whose advice, applied, gives back exactly the matrix the mutation started from.
RESTORES = {"versions-misspelt", "framework-version-misspelt", "release-tag-typo-placeholder", "ulimit-misspelt",
            "template-missing-suggests", "two-default-versions", "no-default-version", "duplicate-key",
            "same-package-twice", "shm-size-negative", "shm-size-docker-units"}


@pytest.mark.parametrize("case", ADVICE, ids=[c.id for c in ADVICE])
def test_applying_the_advice_gets_past_the_error(project: Path, run_cli, case: Case):
    _, original_plan, _ = run_cli("plan", "--json", "--revision", "0123456789ab", "--matrix",
                                  str(project / "matrix.yaml"))
    matrix, _ = _prepare(project, case)
    _, _, err = run_cli("plan", "--json", "--matrix", str(matrix))
    message = err.strip().splitlines()[0]
    fixed = _apply(matrix.read_text(), message)
    matrix.write_text(fixed)
    code, plan, err = run_cli("plan", "--json", "--revision", "0123456789ab", "--matrix", str(matrix))
    assert code == 0, f"after applying {message!r}: {err}"
    if case.id in RESTORES:
        assert plan == original_plan, f"applying {message!r} did not restore the matrix"


def test_advice_sample_is_large_enough():
    assert len(ADVICE) >= 12
