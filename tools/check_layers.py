#!/usr/bin/env python3
"""Checks the layering of lockstep's sources against docs/layers.txt.

Reports, with file, line and both layers where there are some:

  upward-include  a file of src/ or include/ includes a header of a layer
                  above its own (a quoted include of a src/ header or of a
                  public header, or <lockstep/...>);
  upward-use      a source file names a function or variable that a file of
                  a layer above its own defines (an extern declaration
                  instead of the header is caught too);
  cycle           source files that need each other, directly or round a
                  loop: a strongly connected component of more than one
                  file in the module graph below;
  include-cycle   headers that include each other;
  unmapped        a file of src/ or include/ in no layer of the table;
  unresolved      a quoted include that names no file of the tree.

The module graph. A module is one source file (.c, .cu, .cpp) with the
headers that declare what it defines; the edges are uses, not includes,
because a header shared by several sources (backend_impl.h) says nothing
about which of them a file needs. Module A depends on module B when A's
text — or the body of a macro or inline function in a header A includes,
directly or through other headers — names a function or a variable that B
defines with external linkage (a file-scope definition that is not static
and not inside an anonymous namespace). Every preprocessor branch counts
(a CUDA-only call is a dependency of the CUDA build), so the graph is a
superset of what any one build links: sound for cycles, never blind to
code a build leaves out.

Known violations are listed in an allowlist (one key a line, then the
reason after " # "); the check fails on a violation not on the list and on
a list entry that no longer occurs, so the list only shrinks.

Usage: check_layers.py [--root DIR] [--allow FILE] [--list]
  --list prints every violation's key (the allowlist's form) and exits 0.
"""
import argparse
import fnmatch
import os
import re
import sys

SOURCE_EXT = ('.c', '.cu', '.cpp')
HEADER_EXT = ('.h', '.cuh', '.def')  # .def: an X-macro table included like a header (backend/ops.def)


def read_layers(path):
    """[(name, [paths])] in order, bottom first."""
    layers = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split('#', 1)[0].split()
            if not line:
                continue
            if len(line) < 2:
                raise SystemExit('%s:%d: a layer needs a name and at least one folder or header' % (path, n))
            if any(name == line[0] for name, _ in layers):
                raise SystemExit('%s:%d: layer %s listed twice' % (path, n, line[0]))
            layers.append((line[0], [p.rstrip('/') for p in line[1:]]))
    return layers


def layer_of(rel, layers):
    """(rank, name) of the layer holding rel, by the longest matching path."""
    best = None
    for rank, (name, paths) in enumerate(layers):
        for p in paths:
            if rel == p or rel.startswith(p + '/'):
                if best is None or len(p) > best[2]:
                    best = (rank, name, len(p))
    return (best[0], best[1]) if best else None


def tree_files(root):
    out = []
    for top in ('src', 'include'):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith(SOURCE_EXT + HEADER_EXT):
                    out.append(os.path.relpath(os.path.join(d, f), root))
    return sorted(out)


# ---- lexing: comments and literals out, line numbers kept -------------------

def strip_code(text):
    """text with comments replaced by spaces and string/char literals by "" / '',
    newlines kept so that line numbers stay right."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '/' and i + 1 < n and text[i + 1] == '/':
            j = text.find('\n', i)
            j = n if j < 0 else j
            # a // comment ends at the newline, unless that newline is escaped
            while j < n and text[j - 1] == '\\':
                k = text.find('\n', j + 1)
                j = n if k < 0 else k
            out.append(' ' * 0 + '\n' * text.count('\n', i, j))
            i = j
        elif c == '/' and i + 1 < n and text[i + 1] == '*':
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(' ' + '\n' * text.count('\n', i, j))
            i = j
        elif c in '"\'':
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return ''.join(out)


INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
TOKEN_RE = re.compile(r'[A-Za-z_]\w*|\S')


def split_lines(text):
    """The raw lines (for includes) and the stripped code split into
    preprocessor directives (with their continuation lines) and the rest."""
    raw = text.split('\n')
    code = strip_code(text).split('\n')
    directives, body = [], []  # directives: (line, text); body: (line, text)
    i = 0
    while i < len(code):
        line = code[i]
        if line.lstrip().startswith('#'):
            start, d = i, line
            while d.endswith('\\') and i + 1 < len(code):
                i += 1
                d = d[:-1] + ' ' + code[i]
            directives.append((start + 1, d))
        else:
            body.append((i + 1, line))
        i += 1
    return raw, directives, body


class Parsed:
    def __init__(self):
        self.includes = []  # (line, '"' or '<', name)
        self.defines = {}   # external name -> line
        self.refs = set()   # every identifier of the code and of the macro bodies
        self.bodies = {}    # macro or static function -> identifiers of its body (what a user of it inherits)


KEYWORDS = set('''auto break case char const continue default do double else enum extern float for goto if inline int
long register restrict return short signed sizeof static struct switch typedef union unsigned void volatile while _Bool
_Atomic _Thread_local _Noreturn _Alignas _Alignof _Static_assert bool true false NULL template typename namespace class
public private protected operator new delete this __global__ __device__ __host__ __forceinline__ __restrict__ const_cast
static_cast reinterpret_cast'''.split())


def parse(text):
    p = Parsed()
    raw, directives, body = split_lines(text)
    for n, line in enumerate(raw, 1):
        m = INCLUDE_RE.match(line)
        if m:
            p.includes.append((n, m.group(1), m.group(2).strip()))
    for _, d in directives:
        m = re.match(r'\s*#\s*define\s+(\w+)(\([^)]*\))?(.*)', d)
        if m:
            ids = set(re.findall(r'[A-Za-z_]\w*', m.group(3)))
            p.refs |= ids
            p.bodies.setdefault(m.group(1), set()).update(ids)
    toks = []
    for n, line in body:
        for t in TOKEN_RE.findall(line):
            toks.append((t, n))
    for t, _ in toks:
        if t[0].isalpha() or t[0] == '_':
            p.refs.add(t)
    find_definitions(toks, p)
    return p


def matching(toks, i, open_, close):
    """index of the token closing the bracket opened at toks[i]"""
    depth = 0
    for j in range(i, len(toks)):
        if toks[j][0] == open_:
            depth += 1
        elif toks[j][0] == close:
            depth -= 1
            if depth == 0:
                return j
    return len(toks) - 1


def find_definitions(toks, p):
    """External definitions at file scope (functions and variables) into
    p.defines; identifiers inside function bodies into p.body_refs."""
    decl = []
    i = 0
    while i < len(toks):
        t, line = toks[i]
        if t == '}':  # the end of an extern "C" { block: transparent
            decl = []
            i += 1
            continue
        if t == '{':
            words = [w for w, _ in decl]
            if words in (['extern'], ['extern', '"', '"']) or words == ['extern']:
                decl = []  # extern "C" { ... }: its contents are file scope
                i += 1
                continue
            end = matching(toks, i, '{', '}')
            if 'namespace' in words or 'struct' in words[:1] or 'union' in words[:1] or 'enum' in words[:1] or \
                    'typedef' in words or '=' in words or ')' not in words:
                # a namespace (anonymous here: internal), a type or an initialiser: the
                # statement goes on to its ';'
                if 'namespace' in words:
                    decl = []
                else:
                    decl.append(('{}', line))
                i = end + 1
                continue
            # a function definition: the name is the identifier before the '(' of the
            # parameter list, or X in LK_ISA(X)(...)
            name = function_name(decl)
            if name and 'static' not in words:
                p.defines.setdefault(name[0], name[1])
            elif name:
                p.bodies.setdefault(name[0], set()).update(
                    w for w, _ in toks[i:end + 1] if w[0].isalpha() or w[0] == '_')
            decl = []
            i = end + 1
            continue
        if t == ';':
            variable_names(decl, p)
            decl = []
            i += 1
            continue
        decl.append((t, line))
        i += 1


def function_name(decl):
    # the last ')' closes the parameter list; find its '('
    k = len(decl) - 1
    while k >= 0 and decl[k][0] != ')':
        k -= 1
    depth = 0
    while k >= 0:
        if decl[k][0] == ')':
            depth += 1
        elif decl[k][0] == '(':
            depth -= 1
            if depth == 0:
                break
        k -= 1
    k -= 1
    if k < 0:
        return None
    if decl[k][0] == ')':  # LK_ISA(name)(...)
        if k >= 3 and decl[k - 3][0] == 'LK_ISA' and decl[k - 2][0] == '(':
            return decl[k - 1]
        return None
    w = decl[k][0]
    if (w[0].isalpha() or w[0] == '_') and w not in KEYWORDS:
        return decl[k]
    return None


def variable_names(decl, p):
    words = [w for w, _ in decl]
    if not words or words[0] in ('typedef', 'extern', 'static', 'template', 'using') or 'static' in words or \
            'extern' in words or 'typedef' in words:
        return
    # split into declarators at top-level commas; in each, the name is the
    # identifier before '=', '[' or the end, or inside '(*name)'
    depth = 0
    parts, cur = [], []
    for w, n in decl:
        if w in '([':
            depth += 1
        elif w in ')]':
            depth -= 1
        if w == ',' and depth == 0:
            parts.append(cur)
            cur = []
        else:
            cur.append((w, n))
    parts.append(cur)
    for part in parts:
        ws = [w for w, _ in part]
        if '(' in ws:
            k = ws.index('(')
            if k + 2 < len(ws) and ws[k + 1] == '*' and ws[k + 2] not in KEYWORDS:
                p.defines.setdefault(part[k + 2][0], part[k + 2][1])  # a function pointer variable
            continue  # a prototype
        cut = len(ws)
        for stop in ('=', '['):
            if stop in ws:
                cut = min(cut, ws.index(stop))
        if cut == 0:
            continue
        w, n = part[cut - 1]
        if (w[0].isalpha() or w[0] == '_') and w not in KEYWORDS and (cut < 2 or ws[cut - 2] not in (
                'struct', 'union', 'enum')) and cut >= 2 - (parts.index(part) > 0):
            p.defines.setdefault(w, n)


# ---- the checks -------------------------------------------------------------

class Checker:
    def __init__(self, root, layers):
        self.root = root
        self.layers = layers
        self.files = tree_files(root)
        self.parsed = {}
        for f in self.files:
            with open(os.path.join(root, f), errors='replace') as fh:
                self.parsed[f] = parse(fh.read())
        self.fileset = set(self.files)
        self.violations = {}  # key -> message

    def add(self, key, msg):
        self.violations.setdefault(key, msg)

    def resolve(self, f, kind, name):
        if kind == '<':
            if not (name.startswith('lockstep/') or name == 'lockstep.h'):
                return None
            cands = [os.path.join('include', name)]
        else:
            cands = [os.path.normpath(os.path.join(os.path.dirname(f), name)), os.path.join('src', name),
                     os.path.join('include', name)]
        for c in cands:
            if c in self.fileset:
                return c
        return None if kind == '<' else False

    def layer(self, f):
        return layer_of(f, self.layers)

    def run(self):
        for f in self.files:
            if not self.layer(f):
                self.add('unmapped %s' % f, '%s: in no layer of docs/layers.txt (add its folder or header to a layer)'
                         % f)
        self.incl = {f: set() for f in self.files}
        for f in self.files:
            lf = self.layer(f)
            for line, kind, name in self.parsed[f].includes:
                target = self.resolve(f, kind, name)
                if target is False:
                    self.add('unresolved %s -> %s' % (f, name),
                             '%s:%d: #include "%s" names no file of src/ or include/' % (f, line, name))
                    continue
                if target is None:
                    continue
                self.incl[f].add(target)
                lt = self.layer(target)
                if lf and lt and lt[0] > lf[0]:
                    inc = '"%s"' % name if kind == '"' else '<%s>' % name
                    self.add('upward-include %s -> %s' % (f, target),
                             '%s:%d: #include %s points up a layer: %s is in layer %s, %s is in layer %s above it '
                             '(a layer may include only its own and lower layers: docs/layers.txt)'
                             % (f, line, inc, f, lf[1], target, lt[1]))
        self.check_include_cycles()
        self.check_modules()
        return self.violations

    def closure(self, f, seen=None):
        """headers f includes, directly or not"""
        seen = set() if seen is None else seen
        for h in self.incl[f]:
            if h not in seen:
                seen.add(h)
                self.closure(h, seen)
        return seen

    def check_include_cycles(self):
        headers = [f for f in self.files if f.endswith(HEADER_EXT)]
        graph = {h: sorted(x for x in self.incl[h] if x.endswith(HEADER_EXT)) for h in headers}
        for comp in sccs(graph):
            if len(comp) > 1:
                self.add('include-cycle %s' % ' '.join(sorted(comp)),
                         'headers include each other: %s' % ' -> '.join(cycle_path(graph, comp)))

    def check_modules(self):
        sources = [f for f in self.files if f.endswith(SOURCE_EXT)]
        definers = {}
        for f in sources:
            for name in self.parsed[f].defines:
                definers.setdefault(name, []).append(f)
        self.uses = {}
        graph = {}
        for f in sources:
            # what f names, plus what the macros and inline functions it names from
            # its headers name in their bodies, and so on; a name f defines is f's own
            refs = set(self.parsed[f].refs)
            bodies = {}
            for h in self.closure(f):
                for k, v in self.parsed[h].bodies.items():
                    bodies.setdefault(k, set()).update(v)
            todo = [r for r in refs if r in bodies]
            while todo:
                for r in bodies.pop(todo.pop(), ()):
                    if r not in refs:
                        refs.add(r)
                        if r in bodies:
                            todo.append(r)
            refs -= set(self.parsed[f].defines)
            edges = {}
            for name in refs:
                for g in definers.get(name, ()):
                    if g != f:
                        edges.setdefault(g, set()).add(name)
            self.uses[f] = edges
            graph[f] = sorted(edges)
        for f in sources:
            lf = self.layer(f)
            for g, names in sorted(self.uses[f].items()):
                lg = self.layer(g)
                if lf and lg and lg[0] > lf[0]:
                    name = sorted(names)[0]
                    line = self.first_line(f, name)
                    self.add('upward-use %s -> %s' % (f, g),
                             '%s:%d: uses %s, defined in %s:%d: %s is in layer %s, %s is in layer %s above it'
                             % (f, line, ', '.join(sorted(names)), g, self.parsed[g].defines[name], f, lf[1], g,
                                lg[1]))
        for comp in sccs(graph):
            if len(comp) > 1:
                path = cycle_path(graph, comp)
                steps = []
                for a, b in zip(path, path[1:]):
                    names = sorted(self.uses[a][b])
                    steps.append('%s:%d uses %s (%s)' % (a, self.first_line(a, names[0]), ', '.join(names[:3]) +
                                                         (', ...' if len(names) > 3 else ''), b))
                self.add('cycle %s' % ' '.join(sorted(comp)),
                         'files that need each other (%d in the loop): %s' % (len(comp), '; '.join(steps)))

    def first_line(self, f, name):
        """the first line of f naming `name` outside a comment (0: only through a header's macro)"""
        with open(os.path.join(self.root, f), errors='replace') as fh:
            code = strip_code(fh.read()).split('\n')
        pat = re.compile(r'\b%s\b' % re.escape(name))
        for n, line in enumerate(code, 1):
            if pat.search(line) and not INCLUDE_RE.match(line):
                return n
        return 0


def sccs(graph):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for v0 in sorted(graph):
        if v0 in index:
            continue
        work = [(v0, 0)]
        while work:
            v, k = work.pop()
            if k == 0:
                index[v] = low[v] = counter[0]
                counter[0] += 1
                stack.append(v)
                on.add(v)
            succ = graph.get(v, [])
            if k < len(succ):
                work.append((v, k + 1))
                w = succ[k]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(comp)
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
    return out


def cycle_path(graph, comp):
    """A shortest loop through the component's first file (by name): a list
    that starts and ends with that file."""
    comp = set(comp)
    start = min(comp)
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in graph.get(v, []):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w in comp and w not in prev:
                prev[w] = v
                queue.append(w)
    return sorted(comp)


def read_allow(path):
    allow = {}
    if not path or not os.path.exists(path):
        return allow
    with open(path) as f:
        for n, line in enumerate(f, 1):
            s = line.strip()
            if not s or s.startswith('#'):
                continue
            key, _, why = s.partition(' # ')
            allow[' '.join(key.split())] = (n, why.strip())
    return allow


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--root', default=os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')))
    ap.add_argument('--layers', help='the layer table (default ROOT/docs/layers.txt)')
    ap.add_argument('--allow', help='the allowlist of known violations (default ROOT/tests/layering/known_violations.txt)')
    ap.add_argument('--list', action='store_true', help='print every violation key and exit 0')
    args = ap.parse_args(argv)
    layers = read_layers(args.layers or os.path.join(args.root, 'docs', 'layers.txt'))
    c = Checker(args.root, layers)
    found = c.run()
    if args.list:
        for k in sorted(found):
            print(k)
            print('    ' + found[k])
        return 0
    allow_path = args.allow or os.path.join(args.root, 'tests', 'layering', 'known_violations.txt')
    allow = read_allow(allow_path)
    bad = 0
    for k in sorted(found):
        if k not in allow:
            print('layering: %s' % found[k])
            bad += 1
    for k, (n, _) in sorted(allow.items(), key=lambda kv: kv[1][0]):
        if k not in found:
            print('layering: %s:%d: "%s" no longer occurs: remove it from the list' % (allow_path, n, k))
            bad += 1
    known = len(allow) - sum(1 for k in allow if k not in found)
    print('layering: %d files in %d layers; %d known violations listed, %d new or stale' %
          (len(c.files), len(layers), known, bad))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
