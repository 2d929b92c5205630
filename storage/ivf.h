/*
 * ivf.h — an IVF-Flat vector index (inner product; cosine on unit vectors) with k-means
 * training, nprobe, a step API for retrieval in sub-stages, similarity-aware search
 * with an exact early stop, per-list access counts, and persistence in the store per
 * app and name.
 *
 * Training clusters a sample of the vectors into nlist lists (spherical k-means: each
 * centroid is the unit-length mean of its members); every vector added goes to the list
 * of its best centroid, kept there as int8 with a float scale (storage/kb.h's format, a
 * quarter of float32's bytes: a knowledge base's rows go in as they are stored). A query
 * searches the nprobe lists whose centroids score best, like FAISS's IndexIVFFlat with an
 * inner-product quantizer, scoring the int8 rows as they are against the query quantized
 * to int16 (vdist_quantize_query, vdist_dot_q8; a batch's queries in blocks, each row read
 * once for a block): a score is the one an exact search of the same rows gives.
 *
 * Search is a state machine over (query, list) pairs, so that a scheduler can split one
 * retrieval, or a batch of them, into sub-stages of bounded cost:
 *   ivf_search_begin   picks each query's lists (and orders them),
 *   ivf_search_step    scans up to max_lists lists, each once for all the queries of the
 *                      batch that probe it (a list is read once per step, not once per
 *                      query), and says whether the search is done; the lists are those
 *                      the queries need next, taken query by query from where the last
 *                      step stopped, so that small steps serve every query in turn,
 *   ivf_search_results gives a query's best k so far (final once done).
 * Results do not depend on how the work was split into steps: ties are broken by the
 * lower id, and a pair's score is the same in any batch (engine/vdist.h). Centroids are
 * scored with sgemm for batches of 16 queries or more, so a query's lists can differ
 * between a batch and a search of its own where two centroids tie to f32 rounding.
 *
 * Similarity-aware search (HedraRAG): a query may bring hint lists, the lists of its
 * request's recent results; those of its nprobe lists are searched first, then the
 * rest. With early_stop, a list is skipped once its bound says none of its vectors can
 * enter the query's top k. A score in list c is at most dot(q, c) + |q| * radius(c)
 * (Cauchy-Schwarz; radius is the largest distance of a member from the centroid), and
 * at most the best a vector can do within the range of projections on c that the list's
 * members have (a cone around c); both bounds are widened for f32 rounding. A skipped
 * list could not have changed the result, which equals the full nprobe search. How much
 * is skipped depends on how tight the lists are: in hundreds of dimensions spread
 * clusters leave the bounds above the top scores (bench/ivf).
 * Hints change only the order, never the results, so stale hints cost time only.
 *
 * The index must not change (add, remove, train, load) while a search over it is in
 * progress. Functions that can fail return 0, or -1 with err. One thread at a time.
 */
#ifndef LLMS_STORAGE_IVF_H
#define LLMS_STORAGE_IVF_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/err.h"
#include "storage/store.h"

/* Most results a query may ask for. */
#define IVF_K_MAX 1024
/* Largest dimension and list count an index may have. */
#define IVF_DIM_MAX 16384
#define IVF_NLIST_MAX 65536

typedef struct ivf ivf;

/* An empty, untrained index of dim-float vectors; NULL with err. */
ivf *ivf_new(int dim, char err[ERR_MAX]);
void ivf_free(ivf *ix);

int ivf_dim(const ivf *ix);
/* Lists (0 until trained) and vectors held. */
int ivf_nlist(const ivf *ix);
int64_t ivf_count(const ivf *ix);

typedef struct ivf_train_params {
    int nlist;               /* lists, 1..IVF_NLIST_MAX, at most the training vectors */
    int iters;               /* k-means iterations (0: 10) */
    int max_points_per_list; /* training sample: at most this many vectors per list
                              * (0: 256, as FAISS) */
    uint64_t seed;           /* sample and initial centroids */
} ivf_train_params;

/* Trains the centroids of an empty, untrained index on vecs (n, dim). Adds nothing. */
int ivf_train(ivf *ix, const float *vecs, int64_t n, int dim, const ivf_train_params *p,
              char err[ERR_MAX]);

/* Training in steps, for a caller that must stay responsive (llmsd trains in idle time
 * and stops for a request: a whole training of 200k vectors takes tens of seconds).
 * ivf_trainer_new takes the sample (row writes row i of the n training vectors, dim
 * floats, into out; only the sampled rows are asked for), each ivf_trainer_step assigns
 * about rows sample rows (whole blocks of 256) and returns 1 once the last iteration
 * ended and ix has its centroids, 0 while there is more, -1 with err. The centroids are
 * ivf_train's, however the work is split. ix stays untrained until the end; it must
 * outlive the trainer and not change meanwhile. */
typedef struct ivf_trainer ivf_trainer;
typedef void (*ivf_row_fn)(void *arg, int64_t i, float *out);
ivf_trainer *ivf_trainer_new(ivf *ix, int64_t n, const ivf_train_params *p, ivf_row_fn row,
                             void *arg, char err[ERR_MAX]);
int ivf_trainer_step(ivf_trainer *t, int64_t rows, char err[ERR_MAX]);
void ivf_trainer_free(ivf_trainer *t);

/* Adds vecs (n, dim) with their ids (should be unique: a duplicate is found twice) to a
 * trained index, quantized (store_vec_quantize). Non-finite values are refused, and then
 * nothing is added. */
int ivf_add(ivf *ix, const int64_t *ids, const float *vecs, int64_t n, int dim,
            char err[ERR_MAX]);

/* The same for vectors quantized already: row i is q[i] (dim int8) times scale[i]. A
 * negative or non-finite scale is refused. */
int ivf_add_q8(ivf *ix, const int64_t *ids, const int8_t *q, const float *scale, int64_t n,
               int dim, char err[ERR_MAX]);

/* Copies the ids of all vectors held (ivf_count of them), ascending, into ids. */
void ivf_ids(const ivf *ix, int64_t *ids);

/* Removes the vectors with the n ids given; *removed counts them (may be NULL). */
int ivf_remove(ivf *ix, const int64_t *ids, int64_t n, int64_t *removed, char err[ERR_MAX]);

/* ---- search ---- */

typedef struct ivf_hit {
    int64_t id;
    float score;   /* inner product with the query */
    int32_t list;  /* where it was found: a hint for the request's next search */
} ivf_hit;

typedef struct ivf_search_params {
    int k;           /* results per query, 1..IVF_K_MAX */
    int nprobe;      /* lists per query (above nlist: all) */
    bool early_stop; /* skip lists that cannot change the top k (same results, less work) */
} ivf_search_params;

/* A query's hint lists (similarity-aware search): lists[0..n). */
typedef struct ivf_hints {
    const int32_t *lists;
    int n;
} ivf_hints;

typedef struct ivf_search ivf_search;

/* Starts a search of queries (n_q, dim) in a trained index: scores the centroids and
 * fixes each query's nprobe lists. hints is NULL or has n_q entries. Allocates all the
 * search needs, so steps cannot fail. NULL with err for a dimension other than the
 * index's, an untrained index, non-finite queries or parameters out of range. */
ivf_search *ivf_search_begin(ivf *ix, const float *queries, int n_q, int dim,
                             const ivf_search_params *p, const ivf_hints *hints,
                             char err[ERR_MAX]);

/* Scans up to max_lists (>= 1) lists for the queries waiting for them; returns true
 * once every query has searched (or skipped) all its lists. */
bool ivf_search_step(ivf_search *s, int max_lists);

/* Query q's best results so far, best first, into hits (k entries); returns how many. */
int ivf_search_results(const ivf_search *s, int q, ivf_hit *hits);

typedef struct ivf_search_stats {
    int64_t lists_scanned;   /* (query, list) pairs scanned */
    int64_t lists_skipped;   /* (query, list) pairs the early stop left out */
    int64_t vectors_scanned; /* (query, vector) pairs scored */
    int64_t list_reads;      /* lists read (one read serves every query of a step) */
    int steps;
} ivf_search_stats;

void ivf_search_get_stats(const ivf_search *s, ivf_search_stats *st);
void ivf_search_free(ivf_search *s);

/* One-shot search: hits (n_q, p->k) with n_hits[q] results for query q. */
int ivf_search_all(ivf *ix, const float *queries, int n_q, int dim, const ivf_search_params *p,
                   ivf_hit *hits, int *n_hits, char err[ERR_MAX]);

/* ---- hot lists ---- */

/* The n (or fewer, when fewer were used) lists scanned most, most used first (ties: lower
 * list), into lists; returns how many. Counts (query, list) scans since training or
 * loading. */
int ivf_hot_lists(const ivf *ix, int n, int32_t *lists);

/* Packs the rows of the most scanned lists (ivf_hot_lists order) that fit in
 * max_bytes (STORE_VEC_BYTES(dim) a row) into one copy in large pages, which searches then read instead of the lists'
 * own arrays (same values, so the same results); the lists not taken, and any list
 * changed later, are read from their arrays. May be called between steps of a search
 * (not during a step). max_bytes 0 drops the copy. */
int ivf_hot_refresh(ivf *ix, size_t max_bytes, char err[ERR_MAX]);

/* Bytes of rows the hot copy holds now. */
size_t ivf_hot_bytes(const ivf *ix);

/* ---- persistence ----
 *
 * The store keeps an index's centroids and each list's ids (varints, a byte or two an
 * id), not its vectors: those are the caller's own (a knowledge base's passages), given
 * back to ivf_load, so an index costs next to nothing on disk. */

/* Stores ix as app_id's index name (replacing another of that name). When ix was loaded
 * from or saved to this name before, only the lists changed since are written. One
 * transaction (a savepoint inside the caller's). */
int ivf_save(store *s, int64_t app_id, const char *name, ivf *ix, char err[ERR_MAX]);

/* The vectors a loaded index's lists take their rows from: n of them, ids ascending, row
 * i q[i * dim..] (int8) times scale[i]. */
typedef struct ivf_rows {
    const int64_t *ids;
    const int8_t *q;
    const float *scale;
    int64_t n;
    int dim;
} ivf_rows;

/* Loads app_id's index name into *out, its vectors from rows; *found false (and *out
 * NULL) when there is none. A stored id rows lacks is left out (a vector removed since
 * the save; its list is written again by the next save); one rows has and no list holds
 * is not added (ivf_ids tells which are). A row that does not check out (sizes, list
 * numbers, checksums), or rows of another dimension, is an error naming it. */
int ivf_load(store *s, int64_t app_id, const char *name, const ivf_rows *rows, ivf **out,
             bool *found, char err[ERR_MAX]);

/* Deletes app_id's index name; *found says whether it existed. */
int ivf_drop(store *s, int64_t app_id, const char *name, bool *found, char err[ERR_MAX]);

#endif
