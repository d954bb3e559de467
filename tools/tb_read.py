#!/usr/bin/env python3
"""Reads TensorBoard event files without TensorFlow or protobuf: an
independent check of lockstep's TensorBoardLogger (its own CRC32C and
protobuf decoding, written from the format's documentation, not from the C
code). Prints one line per scalar, "step<TAB>tag<TAB>value", value as the
float32's shortest round-trip text (%.9g), after a first line
"file_version<TAB>..." and text summaries as "step<TAB>tag<TAB>text:<len>".

  tools/tb_read.py EVENTS_FILE            # the records, CRCs verified
  tools/tb_read.py --tensorboard FILE     # the same through TensorBoard's
                                          # own loader (exit 77 if missing)
Exit status 1 with a message naming the record on any corruption.
"""
import struct
import sys


def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(blob):
    """Yields the payload of each TFRecord, verifying both CRCs."""
    pos, index = 0, 0
    while pos < len(blob):
        if pos + 12 > len(blob):
            raise ValueError("record %d: truncated header at byte %d" % (index, pos))
        (length,) = struct.unpack_from("<Q", blob, pos)
        (lcrc,) = struct.unpack_from("<I", blob, pos + 8)
        if masked(crc32c(blob[pos:pos + 8])) != lcrc:
            raise ValueError("record %d: length CRC mismatch at byte %d" % (index, pos))
        start, end = pos + 12, pos + 12 + length
        if end + 4 > len(blob):
            raise ValueError("record %d: truncated data (%d bytes expected)" % (index, length))
        data = blob[start:end]
        (dcrc,) = struct.unpack_from("<I", blob, end)
        if masked(crc32c(data)) != dcrc:
            raise ValueError("record %d: data CRC mismatch" % index)
        yield data
        pos, index = end + 4, index + 1


def varint(buf, pos):
    result, shift = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def fields(buf):
    """Yields (field number, wire type, value) of a protobuf message."""
    pos = 0
    while pos < len(buf):
        key, pos = varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            val, pos = varint(buf, pos)
        elif wt == 1:
            val, pos = buf[pos:pos + 8], pos + 8
        elif wt == 2:
            n, pos = varint(buf, pos)
            val, pos = buf[pos:pos + n], pos + n
        elif wt == 5:
            val, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError("unsupported wire type %d" % wt)
        yield num, wt, val


def decode_event(data):
    ev = {"values": []}
    for num, wt, val in fields(data):
        if num == 1 and wt == 1:
            ev["wall_time"] = struct.unpack("<d", val)[0]
        elif num == 2 and wt == 0:
            ev["step"] = val - (1 << 64) if val >= 1 << 63 else val
        elif num == 3 and wt == 2:
            ev["file_version"] = val.decode()
        elif num == 5 and wt == 2:
            for snum, swt, sval in fields(val):
                if snum != 1 or swt != 2:
                    continue
                v = {}
                for vnum, vwt, vval in fields(sval):
                    if vnum == 1:
                        v["tag"] = vval.decode()
                    elif vnum == 2 and vwt == 5:
                        v["simple_value"] = struct.unpack("<f", vval)[0]
                    elif vnum == 8:
                        for tnum, _, tval in fields(vval):
                            if tnum == 8:
                                v["text"] = tval.decode()
                    elif vnum == 9:  # SummaryMetadata.plugin_data{plugin_name, content}
                        for mnum, _, mval in fields(vval):
                            if mnum == 1:
                                pd = dict((n, x) for n, _, x in fields(mval))
                                if pd.get(1) == b"hparams":
                                    v["hparams"] = hparams_plugin(pd.get(2, b""))
                ev["values"].append(v)
    return ev


def hparams_plugin(content):
    """HParamsPluginData as one line: the experiment's hparam names (with
    DataType 1 string, 2 bool, 3 float64) and metric tags, the session
    start's key=value pairs, or the session end's status."""
    for num, _, val in fields(content):
        if num == 2:  # Experiment: hparam_infos 4 {name 1, type 4}, metric_infos 5 {name 1 {tag 2}}
            hps, mts = [], []
            for enum, _, eval_ in fields(val):
                if enum == 4:
                    info = dict((n, x) for n, _, x in fields(eval_))
                    hps.append("%s:%d" % (info.get(1, b"").decode(), info.get(4, 0)))
                elif enum == 5:
                    for n, _, x in fields(eval_):
                        if n == 1:
                            mts += [t.decode() for k, _, t in fields(x) if k == 2]
            return "experiment:%s;metrics:%s" % (",".join(hps), ",".join(mts))
        if num == 3:  # SessionStartInfo.hparams: map<string, Value{2 number, 3 string, 4 bool}>
            pairs = []
            for snum, _, sval in fields(val):
                if snum != 1:
                    continue
                entry = dict((n, x) for n, _, x in fields(sval))
                kind = dict((n, (wt, x)) for n, wt, x in fields(entry.get(2, b"")))
                if 2 in kind:
                    text = fmt(struct.unpack("<d", kind[2][1])[0])
                elif 3 in kind:
                    text = kind[3][1].decode()
                else:
                    text = "true" if kind.get(4, (0, 0))[1] else "false"
                pairs.append("%s=%s" % (entry.get(1, b"").decode(), text))
            return "session_start:" + ",".join(pairs)
        if num == 4:  # SessionEndInfo.status
            return "session_end:status=%d" % dict((n, x) for n, _, x in fields(val)).get(1, 0)
    return "hparams:?"


def fmt(x):
    # the shortest text that reads back as the same float32
    for prec in range(1, 10):
        s = "%.*g" % (prec, x)
        if struct.unpack("<f", struct.pack("<f", float(s)))[0] == x:
            return s
    return "%.9g" % x


def main(argv):
    if len(argv) == 3 and argv[1] == "--tensorboard":
        try:
            from tensorboard.backend.event_processing import event_file_loader
        except ImportError:
            print("tensorboard is not importable", file=sys.stderr)
            return 77
        for ev in event_file_loader.LegacyEventFileLoader(argv[2]).Load():
            if ev.HasField("file_version"):
                print("file_version\t%s" % ev.file_version)
            for v in ev.summary.value:
                if v.HasField("simple_value"):
                    print("%d\t%s\t%s" % (ev.step, v.tag, fmt(v.simple_value)))
                elif v.HasField("tensor"):
                    print("%d\t%s\ttext:%d" % (ev.step, v.tag, len(v.tensor.string_val[0])))
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1], "rb") as f:
        blob = f.read()
    try:
        for data in records(blob):
            ev = decode_event(data)
            if "file_version" in ev:
                print("file_version\t%s" % ev["file_version"])
            if "wall_time" not in ev or ev["wall_time"] < 1e9:
                raise ValueError("event without a plausible wall_time")
            for v in ev["values"]:
                if "simple_value" in v:
                    print("%d\t%s\t%s" % (ev.get("step", 0), v["tag"], fmt(v["simple_value"])))
                elif "text" in v:
                    print("%d\t%s\ttext:%d" % (ev.get("step", 0), v["tag"], len(v["text"].encode())))
                elif "hparams" in v:
                    print("%d\t%s\t%s" % (ev.get("step", 0), v["tag"], v["hparams"]))
    except (ValueError, IndexError, struct.error, UnicodeDecodeError) as e:
        print("%s: %s" % (argv[1], e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
