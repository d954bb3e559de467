#!/usr/bin/python3
"""Writes the .npy fixtures test_formats.c checks lk_npy_read against.

Run with the Debian python (numpy): /usr/bin/python3 tests/data/gen_fixtures.py
Every array is np.arange(24).reshape(2, 3, 4) (or 0/1 for bool) in one
dtype and byte order, so the C test knows every expected value without
reading anything but the file under test.
"""
import os
import numpy as np

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
os.makedirs(out, exist_ok=True)
base = np.arange(24).reshape(2, 3, 4)
for name in ["<f4", ">f4", "<f8", ">f8", "<i2", ">i2", "|i1", "<u2", "<u4", "<i4", "<i8", ">i8", "|u1", "<f2"]:
    a = base.astype(np.dtype(name))
    tag = name.replace("<", "le_").replace(">", "be_").replace("|", "")
    np.save(os.path.join(out, f"arange_{tag}.npy"), a)
np.save(os.path.join(out, "bool.npy"), (base % 3 == 0))
np.save(os.path.join(out, "fortran.npy"), np.asfortranarray(base.astype("<f4")))
np.save(os.path.join(out, "scalar.npy"), np.float32(2.5))
np.save(os.path.join(out, "complex.npy"), base.astype(np.complex64))
with open(os.path.join(out, "v2.npy"), "wb") as f:
    np.lib.format.write_array(f, base.astype("<f4"), version=(2, 0))
