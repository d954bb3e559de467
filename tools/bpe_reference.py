# GPT-2 byte-level BPE in Python (the algorithm of GPT-2's encoder.py, typed here)
# and a small merge learner: checks lockstep's tokenizer on real text
# (tests/data/test_bpe_reference.sh). Needs the `regex` module (\p{L}).
#   bpe_reference.py learn DIR TEXT NCHARS NMERGES   -> DIR/vocab.json, DIR/merges.txt
#   bpe_reference.py check DIR TEXT TOKENS.bin       -> exit 1 at the first differing token
import json, sys, collections, regex as re

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return dict(zip(bs, map(chr, cs)))

PAT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
be = bytes_to_unicode()

def learn(text, nmerges):
    words = collections.Counter("".join(be[b] for b in w.encode("utf-8")) for w in PAT.findall(text))
    seqs = {w: list(w) for w in words}
    merges = []
    for _ in range(nmerges):
        pairs = collections.Counter()
        for w, c in words.items():
            s = seqs[w]
            for a, b in zip(s, s[1:]):
                pairs[a, b] += c
        if not pairs: break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        for w in words:
            s = seqs[w]; i = 0; out = []
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b: out.append(a + b); i += 2
                else: out.append(s[i]); i += 1
            seqs[w] = out
    return merges

def encode(text, vocab, ranks):
    cache = {}
    ids = []
    for w in PAT.findall(text):
        t = "".join(be[b] for b in w.encode("utf-8"))
        if t not in cache:
            word = list(t)
            while len(word) > 1:
                pairs = set(zip(word, word[1:]))
                bigram = min(pairs, key=lambda p: ranks.get(p, float("inf")))
                if bigram not in ranks: break
                a, b = bigram; new = []; i = 0
                while i < len(word):
                    try: j = word.index(a, i)
                    except ValueError: new.extend(word[i:]); break
                    new.extend(word[i:j]); i = j
                    if word[i] == a and i < len(word) - 1 and word[i + 1] == b: new.append(a + b); i += 2
                    else: new.append(word[i]); i += 1
                word = new
            cache[t] = [vocab[s] for s in word]
        ids += cache[t]
    return ids

if __name__ == "__main__":
    mode, d = sys.argv[1], sys.argv[2]
    if mode == "learn":
        text = open(sys.argv[3], encoding="utf-8").read()
        merges = learn(text[: int(sys.argv[4])], int(sys.argv[5]))
        vocab = {be[b]: b for b in range(256)}
        for a, b in merges:
            vocab.setdefault(a + b, len(vocab))
        json.dump(vocab, open(f"{d}/vocab.json", "w"), ensure_ascii=False)
        open(f"{d}/merges.txt", "w", encoding="utf-8").write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    else:
        vocab = json.load(open(f"{d}/vocab.json", encoding="utf-8"))
        ranks = {}
        for i, l in enumerate(open(f"{d}/merges.txt", encoding="utf-8").read().split("\n")[1:]):
            if l: ranks.setdefault(tuple(l.split(" ")), i)
        text = open(sys.argv[3], "rb").read().decode("utf-8")
        ids = encode(text, vocab, ranks)
        import struct
        b = open(sys.argv[4], "rb").read()
        n = struct.unpack("<3i", b[:12])[2]
        got = list(struct.unpack(f"<{n}H", b[1024:]))
        print(f"reference {len(ids)} tokens, lockstep {n}")
        if got != ids:
            k = next(i for i in range(min(len(got), len(ids))) if got[i] != ids[i]) if any(g != r for g, r in zip(got, ids)) else min(len(got), len(ids))
            print("FIRST DIFF at", k, "ref", ids[k:k+8], "got", got[k:k+8]); sys.exit(1)
        print("identical")
