/*
 * kmeans1d.h — k-means clustering of scalars (the reranker's pruning step).
 *
 * In one dimension the clusters of Lloyd's algorithm are contiguous ranges of the sorted
 * values, so the result is given as range bounds over the caller's sorted array.
 */
#ifndef LLMS_KMEANS1D_H
#define LLMS_KMEANS1D_H

/* The number of clusters the reranker asks for among n values: ceil(sqrt(n)), at least
 * 1 and at most n (n >= 1). */
int kmeans1d_k(int n);

/*
 * Clusters the n values of v, which must be sorted in descending order, into at most k
 * clusters: centres start at the values at the quantiles (j + 1/2) / k (deterministic),
 * then Lloyd's iterations run until no value changes cluster. Clusters that end up
 * empty (e.g. from equal values) are removed. Writes the bounds of the m clusters into
 * bounds (k + 1 entries): cluster j is v[bounds[j] .. bounds[j + 1]), bounds[0] = 0,
 * bounds[m] = n, best (largest values) first. Returns m (>= 1 when n >= 1, 0 when n <= 0).
 */
int kmeans1d(const float *v, int n, int k, int *bounds);

#endif
