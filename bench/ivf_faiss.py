#!/usr/bin/python3
"""FAISS IndexIVFFlat (inner product) beside bench/ivf, on the same vectors, on one thread.

Usage: ivf_faiss.py BASE QUERIES TRUTH DIM NLIST K
BASE and QUERIES are float32 rows of DIM; TRUTH holds int64 rows of K (the exact top K
row numbers of each query). Trains (FAISS's defaults for an inner-product IVF: 10
iterations, spherical, at most 256 points per list), adds, prints "ready <train s> <add s>",
then answers each line "<mode> <nprobe>" on stdin (mode "batch": all queries in one call,
"single": one call per query) with "<seconds> <recall@K>", so that the caller can
interleave its own runs with these.
"""
import sys
import time

import faiss
import numpy as np


def main():
    base_path, query_path, truth_path = sys.argv[1:4]
    dim, nlist, k = (int(a) for a in sys.argv[4:7])
    faiss.omp_set_num_threads(1)
    xb = np.fromfile(base_path, dtype=np.float32).reshape(-1, dim)
    xq = np.fromfile(query_path, dtype=np.float32).reshape(-1, dim)
    truth = np.fromfile(truth_path, dtype=np.int64).reshape(-1, k)
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
    t0 = time.perf_counter()
    index.train(xb)
    t1 = time.perf_counter()
    index.add(xb)
    t2 = time.perf_counter()
    print("ready %.3f %.3f" % (t1 - t0, t2 - t1), flush=True)
    for line in sys.stdin:
        mode, nprobe = line.split()
        index.nprobe = int(nprobe)
        t0 = time.perf_counter()
        if mode == "batch":
            _, ids = index.search(xq, k)
        else:
            ids = np.vstack([index.search(xq[i:i + 1], k)[1] for i in range(len(xq))])
        seconds = time.perf_counter() - t0
        found = sum(len(np.intersect1d(ids[i], truth[i])) for i in range(len(xq)))
        print("%.6f %.6f" % (seconds, found / truth.size), flush=True)


if __name__ == "__main__":
    main()
