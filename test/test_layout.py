"""test_layout.py: the source layout's rules, checked on the files (CPU only, no build needed).

- attention/ includes nothing of the project outside attention/ (it is a library of its own);
- data/ includes nothing from layers/ or attention/ (data sits below both);
- no include cycle between folders, at subfolder level (layers/model, layers/generate, attention/flash2, ...;
  a file directly in a top folder counts as that folder, train_gpt.cu as itself);
- every #include "..." resolves to a file (written from the repository root; relative to the including
  file's folder as a fallback);
- no function longer than 80 lines (the opening brace's line to the closing brace's) in *.c, *.h, *.cu,
  *.cuh under attention/, layers/, data/, test/ and train_gpt.cu, except GPU kernels and their device
  helpers (marked __global__ or __device__);
- scripts/results/ holds results, no patch or source file.

Every checker takes a root folder and returns its problems; each is also run on a small planted bad tree
in a temporary folder, to show it can fail.
"""
import os
import re
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test"))
import harness  # noqa: E402

SOURCE_DIRS = ("attention", "layers", "data", "test")
SOURCE_FILES = ("train_gpt.cu",)
SOURCE_EXTS = (".c", ".h", ".cu", ".cuh")
MAX_FUNCTION_LINES = 80
RESULTS_DIR = os.path.join("scripts", "results")
RESULTS_FORBIDDEN_EXTS = (".patch", ".diff", ".c", ".h", ".cu", ".cuh", ".cpp")
INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.M)


# ---- reading sources --------------------------------------------------------------------------------

def source_files(root):
    """Repository-relative paths (with /) of the C/CUDA sources the rules cover, sorted."""
    out = []
    for top in SOURCE_DIRS:
        for folder, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in files:
                if name.endswith(SOURCE_EXTS):
                    out.append(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/"))
    out += [f for f in SOURCE_FILES if os.path.isfile(os.path.join(root, f))]
    return sorted(out)


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        return f.read()


def blank_comments(text, blank_strings):
    """text with comments (and, when blank_strings, the insides of string and character literals) replaced
    by spaces; newlines stay, so line numbers do not move."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            while i < n and text[i] != "\n":
                out[i] = " "
                i += 1
        elif c == "/" and i + 1 < n and text[i + 1] == "*":
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            for k in range(i, end):
                if text[k] != "\n":
                    out[k] = " "
            i = end
        elif c in "\"'":
            k = i + 1
            while k < n and text[k] != c and text[k] != "\n":
                k += 2 if text[k] == "\\" else 1
            if blank_strings:
                for j in range(i + 1, min(k, n)):
                    if text[j] != "\n":
                        out[j] = " "
            i = k + 1
        else:
            i += 1
    return "".join(out)


def blank_preprocessor(text):
    """text with every preprocessor directive (and its continuation lines) replaced by spaces, so the braces
    of a multi-line macro do not count."""
    lines = text.split("\n")
    in_directive = False
    for k, line in enumerate(lines):
        if in_directive or line.lstrip().startswith("#"):
            in_directive = line.rstrip().endswith("\\")
            lines[k] = " " * len(line)
    return "\n".join(lines)


# ---- includes ---------------------------------------------------------------------------------------

def includes(root, rel):
    """[(line, written, resolved)] of the #include "..." lines of one file; resolved is the repository-relative
    path of the file it names (from the root, else from the including file's folder), None when neither exists."""
    text = blank_comments(read(root, rel), blank_strings=False)
    out = []
    for m in INCLUDE_RE.finditer(text):
        written = m.group(1)
        line = text.count("\n", 0, m.start()) + 1
        resolved = None
        for base in ("", os.path.dirname(rel)):
            cand = os.path.normpath(os.path.join(base, written)).replace(os.sep, "/")
            if not cand.startswith("../") and os.path.isfile(os.path.join(root, cand)):
                resolved = cand
                break
        out.append((line, written, resolved))
    return out


def include_target(written, resolved):
    return resolved if resolved else os.path.normpath(written).replace(os.sep, "/")


def check_includes_resolve(root):
    problems = []
    for rel in source_files(root):
        for line, written, resolved in includes(root, rel):
            if resolved is None:
                problems.append(f'{rel}:{line}: #include "{written}" names no file (from the repository root or '
                                f'from {os.path.dirname(rel) or "the root"}/)')
    return problems


def check_no_includes_from(root, folder, forbidden, allowed_only_inside=False):
    """Problems for files under `folder` that include a file under one of `forbidden` (top folders), or, with
    allowed_only_inside, any project file outside `folder`."""
    problems = []
    for rel in source_files(root):
        if not rel.startswith(folder + "/"):
            continue
        for line, written, resolved in includes(root, rel):
            target = include_target(written, resolved)
            top = target.split("/")[0]
            if (allowed_only_inside and not target.startswith(folder + "/")) or top in forbidden:
                problems.append(f'{rel}:{line}: includes "{written}" ({target}), outside what {folder}/ may use')
    return problems


def check_attention_self_contained(root):
    return check_no_includes_from(root, "attention", (), allowed_only_inside=True)


def check_data_below_layers_and_attention(root):
    return check_no_includes_from(root, "data", ("layers", "attention"))


def folder_node(rel):
    """The include graph's node of a file: its top folder and first subfolder (layers/model), the top folder for
    a file directly in it (layers), the file itself at the root (train_gpt.cu)."""
    parts = rel.split("/")
    if len(parts) == 1:
        return rel
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def folder_graph(root):
    """{node: {node it includes: 'file:line' of the first such include}}, self-edges left out."""
    graph = {}
    for rel in source_files(root):
        src = folder_node(rel)
        graph.setdefault(src, {})
        for line, written, resolved in includes(root, rel):
            if resolved is None:
                continue  # check_includes_resolve reports it
            dst = folder_node(resolved)
            if dst != src:
                graph[src].setdefault(dst, f"{rel}:{line}")
    return graph


def find_cycle(graph):
    """One cycle as a list of nodes (first == last), or None."""
    color, stack = {}, []

    def visit(node):
        color[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, {})):
            if color.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if color.get(nxt) is None:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        color[node] = 2
        return None

    for node in sorted(graph):
        if color.get(node) is None:
            found = visit(node)
            if found:
                return found
    return None


def check_no_folder_cycle(root):
    graph = folder_graph(root)
    cycle = find_cycle(graph)
    if not cycle:
        return []
    edges = ", ".join(f"{a} -> {b} ({graph[a][b]})" for a, b in zip(cycle, cycle[1:]))
    return [f"include cycle between folders: {' -> '.join(cycle)}; edges: {edges}"]


# ---- function lengths -------------------------------------------------------------------------------

TRANSPARENT_RE = re.compile(r'(\bnamespace\b[\w:\s]*|\bextern\s*"\s*"\s*|\b(struct|class|union)\b[^(){};=]*)$')
QUALIFIERS_RE = re.compile(r"(\s*(\bconst\b|\bnoexcept\b|\boverride\b|\bfinal\b|\bvolatile\b|->\s*[\w:<>*&\s]+))*\s*$")


def matching_brace(code, i):
    """Index of the brace closing the one at code[i] (len(code) when unbalanced)."""
    depth = 0
    for k in range(i, len(code)):
        if code[k] == "{":
            depth += 1
        elif code[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(code)


def function_name(head):
    """The name before the parameter list of a function head ending in ')'."""
    depth, k = 0, len(head) - 1
    while k >= 0:
        if head[k] == ")":
            depth += 1
        elif head[k] == "(":
            depth -= 1
            if depth == 0:
                break
        k -= 1
    m = re.search(r"([\w:~]+(?:\s*operator\s*\S+)?)\s*$", head[:max(k, 0)])
    return m.group(1) if m else "?"


def strip_template_parameters(head):
    """head without its template <...> parameter lists (their default arguments hold '=')."""
    while True:
        m = re.search(r"\btemplate\s*<", head)
        if not m:
            return head
        depth, k = 0, m.end() - 1
        while k < len(head):
            depth += head[k] == "<"
            depth -= head[k] == ">"
            if depth == 0:
                break
            k += 1
        head = head[:m.start()] + " " + head[k + 1:]


def is_function_head(head):
    head = strip_template_parameters(QUALIFIERS_RE.sub("", head))
    if not head.endswith(")"):
        return False
    depth, flat = 0, []
    for c in head:  # the head outside parentheses: an '=' there makes an initializer (or a lambda)
        depth += c == "("
        depth -= c == ")"
        if depth == 0:
            flat.append(c)
    flat = "".join(flat)
    return not re.search(r"(?<![=!<>])=(?!=)", flat) or "operator" in flat


def long_functions(text, limit=MAX_FUNCTION_LINES):
    """[(line, name, lines)] of the functions in a C/CUDA source whose body (the opening brace's line to the
    closing brace's) is longer than `limit` lines; __global__ and __device__ functions are left out. Bodies of
    struct, class, union, namespace and extern "C" are scanned for functions; other top-level braces
    (initializers, enums) are skipped."""
    code = blank_preprocessor(blank_comments(text, blank_strings=True))
    out = []
    head_start, i, n = 0, 0, len(code)
    while i < n:
        c = code[i]
        if c in ";}":
            head_start = i + 1
        elif c == "{":
            head = " ".join(code[head_start:i].split())
            if TRANSPARENT_RE.search(head):
                head_start = i + 1  # look inside
            else:
                end = matching_brace(code, i)
                if is_function_head(head) and not re.search(r"\b__(global|device)__\b", head):
                    first, last = code.count("\n", 0, i) + 1, code.count("\n", 0, end) + 1
                    if last - first + 1 > limit:
                        out.append((first, function_name(head), last - first + 1))
                i = end
                head_start = i + 1
        i += 1
    return out


def check_function_lengths(root):
    problems = []
    for rel in source_files(root):
        for line, name, length in long_functions(read(root, rel)):
            problems.append(f"{rel}:{line}: {name} is {length} lines (at most {MAX_FUNCTION_LINES} outside kernels)")
    return problems


# ---- scripts/results --------------------------------------------------------------------------------

def check_results_hold_no_sources(root):
    problems = []
    for folder, dirs, files in os.walk(os.path.join(root, RESULTS_DIR)):
        dirs.sort()
        for name in sorted(files):
            if name.lower().endswith(RESULTS_FORBIDDEN_EXTS):
                rel = os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
                problems.append(f"{rel}: a patch or source file in {RESULTS_DIR}/ "
                                "(results only; code belongs in the tree)")
    return problems


def expect_clean(problems):
    assert not problems, f"{len(problems)} problem(s): " + " | ".join(problems)


# ---- the repository ---------------------------------------------------------------------------------

def test_attention_includes_nothing_outside_attention():
    expect_clean(check_attention_self_contained(ROOT))


def test_data_includes_nothing_from_layers_or_attention():
    expect_clean(check_data_below_layers_and_attention(ROOT))


def test_no_include_cycle_between_folders():
    expect_clean(check_no_folder_cycle(ROOT))


def test_every_project_include_resolves():
    expect_clean(check_includes_resolve(ROOT))


def test_no_function_over_80_lines_outside_kernels():
    expect_clean(check_function_lengths(ROOT))


def test_scripts_results_hold_no_patch_or_source():
    expect_clean(check_results_hold_no_sources(ROOT))


# ---- each checker on a planted bad tree -------------------------------------------------------------

def planted(files):
    """A temporary tree holding `files` ({relative path: text}); the caller removes it."""
    root = tempfile.mkdtemp(prefix="test_layout_")
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return root


def run_planted(files, checker):
    root = planted(files)
    try:
        return checker(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def function_text(lines, head="static int f(void)"):
    """`head` with a body of exactly `lines` lines from '{' to '}'."""
    assert lines >= 2
    return head + " {\n" + "".join(f"    g_x += {k};\n" for k in range(lines - 2)) + "}\n"


def test_layout_attention_check_rejects_an_attention_file_including_layers():
    files = {"attention/flash2/k.cu": '#include "attention/attention.h"\n#include "layers/cuda_common.h"\n',
             "attention/attention.h": "", "layers/cuda_common.h": ""}
    problems = run_planted(files, check_attention_self_contained)
    assert len(problems) == 1 and "attention/flash2/k.cu:2" in problems[0] and "layers/cuda_common.h" in problems[0], \
        problems
    relative = {"attention/flash2/k.cu": '#include "../../layers/cuda_common.h"\n', "layers/cuda_common.h": ""}
    problems = run_planted(relative, check_attention_self_contained)
    assert len(problems) == 1 and "(layers/cuda_common.h)" in problems[0], problems
    clean = {"attention/flash2/k.cu": '#include "attention/attention.h"\n#include "../attention.h"\n',
             "attention/attention.h": ""}
    assert run_planted(clean, check_attention_self_contained) == []


def test_layout_data_check_rejects_a_data_file_including_layers_or_attention():
    files = {"data/loader.h": '#include "data/gpt_config.h"\n#include "layers/model/matmul.cuh"\n'
                              '#include "attention/attention.h"\n',
             "data/gpt_config.h": "", "layers/model/matmul.cuh": "", "attention/attention.h": ""}
    problems = run_planted(files, check_data_below_layers_and_attention)
    assert len(problems) == 2 and "data/loader.h:2" in problems[0] and "data/loader.h:3" in problems[1], problems


def test_layout_cycle_check_rejects_a_planted_cycle():
    files = {"layers/model/a.cuh": '#include "layers/generate/b.cuh"\n',
             "layers/generate/b.cuh": '#include "data/c.h"\n',
             "data/c.h": '#include "layers/model/d.cuh"\n',
             "layers/model/d.cuh": "",
             "test/t.cu": '#include "layers/model/a.cuh"\n'}
    problems = run_planted(files, check_no_folder_cycle)
    assert len(problems) == 1, problems
    assert "data -> layers/model -> layers/generate -> data" in problems[0], problems
    assert "data/c.h:1" in problems[0], problems
    files["data/c.h"] = ""  # the same tree without the back edge
    assert run_planted(files, check_no_folder_cycle) == []


def test_layout_include_check_rejects_an_include_of_a_missing_file():
    files = {"layers/model/a.cuh": '#include "layers/model/b.cuh"\n#include "b.cuh"\n#include "layers/model/c.cuh"\n'
                                   '// #include "commented/out.h"\n',
             "layers/model/b.cuh": ""}
    problems = run_planted(files, check_includes_resolve)
    assert len(problems) == 1 and "layers/model/a.cuh:3" in problems[0] and "layers/model/c.cuh" in problems[0], \
        problems


def test_layout_length_check_rejects_an_81_line_function():
    text = ("struct S {\n    int a;\n};\n"
            "static const int TABLE[] = {\n" + "    1,\n" * 100 + "};\n"
            + function_text(80, "static int fits(void)")
            + function_text(81, "static int too_long(int a,\n                    int b)")
            + function_text(120, "static __global__ void kernel(float* x)")
            + function_text(90, "template <int N>\n__device__ __forceinline__ float helper(float x)")
            + 'static void braces_in_text(void) {\n    const char* s = "}}}{";\n    char c = \'}\';  // }\n}\n'
            + "#define MACRO(x) \\\n    do { \\\n    } while (0)\n"
            + function_text(82, 'extern "C" int exported(void)')
            + function_text(83, "template <int BLOCK = 128, bool FAST = (1 > 0)>\nstatic void launch(int n)"))
    problems = run_planted({"layers/model/f.cuh": text}, check_function_lengths)
    assert len(problems) == 3, problems
    first_line = text.count("\n", 0, text.index("static int too_long")) + 2  # the brace is on the head's 2nd line
    assert f"layers/model/f.cuh:{first_line}: too_long is 81 lines" in problems[0], problems
    assert "exported is 82 lines" in problems[1], problems
    assert "launch is 83 lines" in problems[2], problems
    in_namespace = 'namespace ns {\nextern "C" {\n' + function_text(85, "int inner(void)") + "}\n}\n"
    problems = run_planted({"test/g.cu": in_namespace}, check_function_lengths)
    assert len(problems) == 1 and "test/g.cu:3: inner is 85 lines" in problems[0], problems


def test_layout_results_check_rejects_a_patch_in_results():
    files = {"scripts/results/README.md": "", "scripts/results/h100/bench.json": "{}",
             "scripts/results/h100/fix.patch": "", "scripts/results/kernel.cu": ""}
    problems = run_planted(files, check_results_hold_no_sources)
    assert len(problems) == 2, problems
    assert any("scripts/results/h100/fix.patch" in p for p in problems), problems
    assert any("scripts/results/kernel.cu" in p for p in problems), problems


if __name__ == "__main__":
    harness.run_module(globals())
