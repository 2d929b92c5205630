/* kmeans1d.c — Lloyd's algorithm on sorted scalars (see kmeans1d.h). */
#include "engine/encoder/kmeans1d.h"

#include <math.h>

/* Lloyd's algorithm converges in a handful of steps in 1-D; this only bounds a cycle
 * caused by rounding. */
#define KMEANS1D_MAX_ITER 100

int kmeans1d_k(int n)
{
    if (n <= 1)
        return 1;
    int k = (int)ceil(sqrt((double)n));
    return k > n ? n : k;
}

/* Assigns each value to its nearest centre (centres descending, so the ranges are
 * contiguous); returns whether any bound moved. */
static int kmeans1d_assign(const float *v, int n, const double *c, int m, int *bounds)
{
    int changed = 0, j = 0;
    int nb[m + 1];
    nb[0] = 0;
    for (int i = 0; i < n; i++) {
        while (j + 1 < m && fabs(v[i] - c[j + 1]) < fabs(v[i] - c[j])) {
            j++;
            nb[j] = i;
        }
    }
    for (int jj = j + 1; jj <= m; jj++)
        nb[jj] = n;
    for (int jj = 0; jj <= m; jj++) {
        changed |= nb[jj] != bounds[jj];
        bounds[jj] = nb[jj];
    }
    return changed;
}

int kmeans1d(const float *v, int n, int k, int *bounds)
{
    if (n <= 0)
        return 0;
    if (k < 1)
        k = 1;
    if (k > n)
        k = n;
    double c[k];
    for (int j = 0; j < k; j++)
        c[j] = v[(int)(((double)j + 0.5) * n / k)];
    int m = k;
    for (int j = 0; j <= m; j++)
        bounds[j] = -1;
    for (int it = 0; it < KMEANS1D_MAX_ITER; it++) {
        int changed = kmeans1d_assign(v, n, c, m, bounds);
        /* drop empty clusters, then move centres to their means */
        int w = 0;
        for (int j = 0; j < m; j++) {
            if (bounds[j + 1] == bounds[j])
                continue;
            double s = 0;
            for (int i = bounds[j]; i < bounds[j + 1]; i++)
                s += v[i];
            c[w] = s / (bounds[j + 1] - bounds[j]);
            bounds[w] = bounds[j];
            w++;
        }
        bounds[w] = n;
        changed |= w != m;
        m = w;
        if (!changed)
            break;
    }
    return m;
}
