"""llmsclient: the Python client of llmsd, through ctypes over libllmsclient.so.

    import llmsclient
    c = llmsclient.connect(app="my-app")            # socket: $LLMS_SOCKET or the default
    print(c.complete("Once upon a time", max_tokens=32, temperature=0))
    ctx = c.create_context(system="You are terse.")
    for piece in ctx.call("Hello!", stream=True):
        print(piece, end="", flush=True)
    vectors = c.embed(["a text", "another"])
    hits = c.rerank("query", ["doc one", "doc two"], k=1)   # [RerankHit(index, score)]
    c.kb_create("notes")
    c.kb_add("notes", {"doc-1": "Some text.", "doc-2": "More text."})   # -> passages made
    c.kb_add("notes", {"big": text}, progress=print)   # KbProgress reports while it runs
    r = c.rag("notes", "What does the text say?")   # RagResult: .text, .passages, .outcome
    g = c.graph_run("one-shot", {"question": "What does the text say?", "kb": "notes"})
    print(g.output, g.state["passages"])            # GraphResult

Every failure raises LlmsError, whose .status is the library's status code
(LLMS_ERR_*, e.g. 2 = NOT_FOUND) and .status_name its name.

Threads may share a Client: its calls take turns on its connection. Client says what a
thread may not do meanwhile.

No build step and no third-party packages. The library is loaded at the first call,
from the first of these that loads:

 1. $LLMS_CLIENT_LIB, when set: that file only.
 2. libllmsclient.so in this package's folder.
 3. build/libllmsclient.so of the llmsd checkout this package sits in (python/llmsclient
    run in place, or pip install -e), then of the checkout pip installed it from (pip
    records that folder beside the package, PEP 610 direct_url.json). A folder counts as
    a checkout when it has client/llms.h.
 4. libllmsclient.so.6 in /usr/local/lib and /usr/lib (make install: PREFIX/lib).
 5. libllmsclient.so.6 through the dynamic loader ($LD_LIBRARY_PATH, ld.so.cache).

The current directory is never searched. When none loads, LibraryNotFoundError (an
OSError) names every path tried and why it failed. library_path() says which was loaded.
"""

import contextlib
import ctypes
import glob
import json
import math
import os
import queue
import threading
import urllib.parse
import weakref
from collections import namedtuple
from collections.abc import Mapping

__all__ = ["connect", "library_path", "Client", "Context", "GraphEvent", "GraphInfo",
           "GraphResult", "GraphTiming", "KbHit", "KbInfo", "KbProgress", "LibraryNotFoundError",
           "LlmsError", "RagResult", "RerankHit", "Result"]

LLMS_ERROR_MAX = 256
LLMS_ID_MAX = 128
_UNSET = -(2 ** 31)
_NAN = float("nan")

STATUS_NAMES = {
    0: "OK", 1: "INVALID_ARGUMENT", 2: "NOT_FOUND", 3: "PERMISSION_DENIED",
    4: "RESOURCE_EXHAUSTED", 5: "FAILED_PRECONDITION", 6: "CANCELLED", 7: "INTERNAL",
    8: "UNAVAILABLE", 9: "UNIMPLEMENTED", 10: "MALFORMED_FRAME", 11: "DEADLINE_EXCEEDED",
    100: "IO", 101: "PROTOCOL",
}
STOP_REASONS = ["eos", "max_tokens", "stop_string", "context_full", "cancelled",
                "deadline", "shutdown"]

RETRIEVALS = ["rrf", "sum", "bm25", "vector"]
RAG_OUTCOMES = ["miss", "qa_hit", "qkv_hit"]
SPECULATIONS = ["none", "hit", "rollback"]
KB_PHASES = ["split", "embed", "write"]

RerankHit = namedtuple("RerankHit", "index score")
# logprobs: None, or one TokenLogprob per generated token when a call asked (logprobs=N).
# cached_tokens: a complete's prompt tokens resumed from the daemon's prompt cache.
Result = namedtuple("Result", "text prompt_tokens generated_tokens context_tokens stop_reason "
                              "logprobs cached_tokens", defaults=(None, 0))
# A generated token's log-probability, and top: its step's N likeliest (token, logprob).
TokenLogprob = namedtuple("TokenLogprob", "token logprob top")
KbInfo = namedtuple("KbInfo", "name documents passages bytes passage_tokens overlap_tokens "
                              "qa_entries share_uid embed_model")
KbHit = namedtuple("KbHit", "passage document seq score text metadata")
KbProgress = namedtuple("KbProgress", "phase documents documents_written bytes bytes_split "
                                      "passages passages_embedded passages_written")
RagResult = namedtuple("RagResult", "text outcome passages prompt_tokens reused_tokens "
                                    "reused_passages generated_tokens retrieve_ms prefill_ms "
                                    "decode_ms queue_ms stop_reason qa_similarity")
GraphInfo = namedtuple("GraphInfo", "name builtin inputs n_nodes n_edges output max_steps")
GraphEvent = namedtuple("GraphEvent", "finished node step output value ms generated_tokens "
                                      "speculation")
GraphTiming = namedtuple("GraphTiming", "node runs ms generated_tokens")
GraphResult = namedtuple("GraphResult", "output steps capped timings state total_ms queue_ms "
                                        "speculations spec_hits spec_rollbacks spec_saved_ms "
                                        "prompt_tokens reused_tokens")


class LlmsError(Exception):
    """A failed call: status is the library's code, status_name its name."""

    def __init__(self, status, message):
        self.status = status
        self.status_name = STATUS_NAMES.get(status, str(status))
        super().__init__("%s: %s" % (self.status_name, message))


class _Params(ctypes.Structure):
    _fields_ = [
        ("temperature", ctypes.c_float), ("top_k", ctypes.c_int32),
        ("top_p", ctypes.c_float), ("min_p", ctypes.c_float),
        ("repeat_penalty", ctypes.c_float), ("repeat_last_n", ctypes.c_int32),
        ("max_tokens", ctypes.c_int32), ("has_seed", ctypes.c_int),
        ("seed", ctypes.c_uint64), ("stop", ctypes.POINTER(ctypes.c_char_p)),
        ("n_stop", ctypes.c_size_t), ("raw", ctypes.c_int),
        ("model", ctypes.c_char_p), ("speculation", ctypes.c_int),
        ("frequency_penalty", ctypes.c_float), ("presence_penalty", ctypes.c_float),
        ("logit_bias", ctypes.c_void_p), ("n_logit_bias", ctypes.c_size_t),
        ("logprobs", ctypes.c_int), ("top_logprobs", ctypes.c_int32), ("format", ctypes.c_int),
        ("json_schema", ctypes.c_char_p), ("grammar", ctypes.c_char_p),
        ("ignore_eos", ctypes.c_int),
        ("min_keep", ctypes.c_int32), ("typical_p", ctypes.c_float),
        ("top_n_sigma", ctypes.c_float), ("xtc_probability", ctypes.c_float),
        ("xtc_threshold", ctypes.c_float), ("dynatemp_range", ctypes.c_float),
        ("dynatemp_exponent", ctypes.c_float), ("dry_multiplier", ctypes.c_float),
        ("dry_base", ctypes.c_float), ("dry_allowed_length", ctypes.c_int32),
        ("dry_penalty_last_n", ctypes.c_int32),
        ("dry_sequence_breakers", ctypes.POINTER(ctypes.c_char_p)),
        ("n_dry_sequence_breakers", ctypes.c_size_t), ("mirostat", ctypes.c_int32),
        ("mirostat_tau", ctypes.c_float), ("mirostat_eta", ctypes.c_float),
        ("samplers", ctypes.c_char_p),
    ]


class _LogitBias(ctypes.Structure):
    _fields_ = [("token", ctypes.c_int32), ("bias", ctypes.c_float)]


LLMS_LOGPROBS_MAX = 20


class _TokenLogprob(ctypes.Structure):
    _fields_ = [
        ("token", ctypes.c_int32), ("logprob", ctypes.c_float), ("n_top", ctypes.c_int),
        ("top_token", ctypes.c_int32 * LLMS_LOGPROBS_MAX),
        ("top_logprob", ctypes.c_float * LLMS_LOGPROBS_MAX),
    ]


class _Result(ctypes.Structure):
    _fields_ = [
        ("prompt_tokens", ctypes.c_uint32), ("generated_tokens", ctypes.c_uint32),
        ("context_tokens", ctypes.c_uint32), ("prefill_ms", ctypes.c_double),
        ("decode_ms", ctypes.c_double), ("queue_ms", ctypes.c_double),
        ("stop_reason", ctypes.c_int), ("text", ctypes.c_void_p),
        ("window_slides", ctypes.c_uint32),
        ("logprobs", ctypes.POINTER(_TokenLogprob)), ("n_logprobs", ctypes.c_size_t),
        ("cached_tokens", ctypes.c_uint32),
    ]


class _Embeddings(ctypes.Structure):
    _fields_ = [
        ("n", ctypes.c_size_t), ("dim", ctypes.c_uint32),
        ("values", ctypes.POINTER(ctypes.c_float)),
        ("n_tokens", ctypes.POINTER(ctypes.c_uint32)),
    ]


class _RerankOptions(ctypes.Structure):
    _fields_ = [
        ("top_k", ctypes.c_uint32), ("mode", ctypes.c_int),
        ("cv_threshold", ctypes.c_float), ("target_precision", ctypes.c_float),
        ("stream_weights", ctypes.c_int), ("model", ctypes.c_char_p),
    ]


class _RerankHit(ctypes.Structure):
    _fields_ = [("index", ctypes.c_uint32), ("score", ctypes.c_float)]


class _RerankResult(ctypes.Structure):
    _fields_ = [
        ("n_hits", ctypes.c_size_t), ("hits", ctypes.POINTER(_RerankHit)),
        ("n_documents", ctypes.c_size_t), ("layers_computed", ctypes.POINTER(ctypes.c_uint32)),
        ("n_layer", ctypes.c_size_t), ("pruned_at_layer", ctypes.POINTER(ctypes.c_uint32)),
        ("peak_bytes", ctypes.c_uint64), ("time_ms", ctypes.c_double),
        ("cv_threshold", ctypes.c_float),
    ]


class _KbDoc(ctypes.Structure):
    _fields_ = [("id", ctypes.c_char_p), ("text", ctypes.c_char_p), ("metadata", ctypes.c_char_p)]


class _KbProgress(ctypes.Structure):
    _fields_ = [
        ("phase", ctypes.c_int), ("documents", ctypes.c_uint32),
        ("documents_written", ctypes.c_uint32), ("bytes", ctypes.c_uint64),
        ("bytes_split", ctypes.c_uint64), ("passages", ctypes.c_uint32),
        ("passages_embedded", ctypes.c_uint32), ("passages_written", ctypes.c_uint32),
    ]


class _KbInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p), ("documents", ctypes.c_uint32),
        ("passages", ctypes.c_uint32), ("bytes", ctypes.c_uint64),
        ("passage_tokens", ctypes.c_uint32), ("overlap_tokens", ctypes.c_uint32),
        ("qa_entries", ctypes.c_uint32), ("share_uid", ctypes.c_int),
        ("embed_model", ctypes.c_char_p),
    ]


class _KbOptions(ctypes.Structure):
    _fields_ = [
        ("passage_tokens", ctypes.c_uint32), ("overlap_tokens", ctypes.c_uint32),
        ("share_uid", ctypes.c_int), ("embed_model", ctypes.c_char_p),
    ]


class _KbHit(ctypes.Structure):
    _fields_ = [
        ("passage", ctypes.c_uint64), ("document", ctypes.c_char_p), ("seq", ctypes.c_uint32),
        ("score", ctypes.c_float), ("text", ctypes.c_char_p), ("metadata", ctypes.c_char_p),
    ]


class _RagOptions(ctypes.Structure):
    _fields_ = [
        ("top_k", ctypes.c_uint32), ("retrieval", ctypes.c_int),
        ("system_prompt", ctypes.c_char_p), ("params", ctypes.POINTER(_Params)),
        ("no_qa", ctypes.c_int), ("no_qkv", ctypes.c_int), ("share_system_uid", ctypes.c_int),
    ]


class _RagResult(ctypes.Structure):
    _fields_ = [
        ("outcome", ctypes.c_int), ("passages", ctypes.POINTER(_KbHit)),
        ("n_passages", ctypes.c_size_t), ("prompt_tokens", ctypes.c_uint32),
        ("reused_tokens", ctypes.c_uint32), ("reused_passages", ctypes.c_uint32),
        ("generated_tokens", ctypes.c_uint32), ("retrieve_ms", ctypes.c_double),
        ("prefill_ms", ctypes.c_double), ("decode_ms", ctypes.c_double),
        ("queue_ms", ctypes.c_double), ("stop_reason", ctypes.c_int),
        ("qa_similarity", ctypes.c_float), ("text", ctypes.c_char_p),
    ]


class _GraphNode(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p), ("kind", ctypes.c_int), ("output", ctypes.c_char_p),
        ("prompt", ctypes.c_char_p), ("params", ctypes.POINTER(_Params)),
        ("chat", ctypes.c_int), ("kb", ctypes.c_char_p), ("query", ctypes.c_char_p),
        ("top_k", ctypes.c_uint32), ("retrieval", ctypes.c_int),
    ]


class _GraphEdge(ctypes.Structure):
    _fields_ = [("from", ctypes.c_char_p), ("to", ctypes.c_char_p), ("when", ctypes.c_char_p)]


class _GraphDef(ctypes.Structure):
    _fields_ = [
        ("inputs", ctypes.POINTER(ctypes.c_char_p)), ("n_inputs", ctypes.c_size_t),
        ("nodes", ctypes.POINTER(_GraphNode)), ("n_nodes", ctypes.c_size_t),
        ("edges", ctypes.POINTER(_GraphEdge)), ("n_edges", ctypes.c_size_t),
        ("output", ctypes.c_char_p), ("max_steps", ctypes.c_uint32),
    ]


class _GraphInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p), ("builtin", ctypes.c_int),
        ("inputs", ctypes.POINTER(ctypes.c_char_p)), ("n_inputs", ctypes.c_size_t),
        ("n_nodes", ctypes.c_size_t), ("n_edges", ctypes.c_size_t),
        ("output", ctypes.c_char_p), ("max_steps", ctypes.c_uint32),
    ]


class _GraphVar(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p)]


class _GraphEvent(ctypes.Structure):
    _fields_ = [
        ("finished", ctypes.c_int), ("node", ctypes.c_char_p), ("step", ctypes.c_uint32),
        ("output", ctypes.c_char_p), ("value", ctypes.c_char_p), ("ms", ctypes.c_double),
        ("generated_tokens", ctypes.c_uint32), ("speculation", ctypes.c_int),
    ]


class _GraphTiming(ctypes.Structure):
    _fields_ = [
        ("node", ctypes.c_char_p), ("runs", ctypes.c_uint32), ("ms", ctypes.c_double),
        ("generated_tokens", ctypes.c_uint32),
    ]


class _GraphResult(ctypes.Structure):
    _fields_ = [
        ("output", ctypes.c_char_p), ("steps", ctypes.c_uint32), ("capped", ctypes.c_int),
        ("timings", ctypes.POINTER(_GraphTiming)), ("n_timings", ctypes.c_size_t),
        ("state_names", ctypes.POINTER(ctypes.c_char_p)),
        ("state_values", ctypes.POINTER(ctypes.c_char_p)), ("n_state", ctypes.c_size_t),
        ("total_ms", ctypes.c_double), ("queue_ms", ctypes.c_double),
        ("speculations", ctypes.c_uint32), ("spec_hits", ctypes.c_uint32),
        ("spec_rollbacks", ctypes.c_uint32), ("spec_saved_ms", ctypes.c_double),
        ("prompt_tokens", ctypes.c_uint32), ("reused_tokens", ctypes.c_uint32),
    ]


_GRAPH_EVENT_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_GraphEvent), ctypes.c_void_p)
_TOKEN_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
_KB_PROGRESS_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_KbProgress), ctypes.c_void_p)


# The ABI the Structures above describe: what `make install` installs and what the
# dynamic loader is asked for. An unversioned libllmsclient.so there may be another ABI.
_SONAME = "libllmsclient.so.6"
# Where `make install` puts it (PREFIX/lib; PREFIX is /usr/local unless set). Installed
# through a DESTDIR, nothing may have run ldconfig yet, and the dynamic loader alone would
# not find it under /usr/local/lib.
_PREFIX_LIBS = ("/usr/local/lib", "/usr/lib")


class LibraryNotFoundError(OSError):
    """libllmsclient could not be loaded; the message names every place tried and why
    each failed, and how to point the client at the library."""


def _checkout(root):
    """root when it is an llmsd source checkout (it has client/llms.h), else None."""
    return root if os.path.isfile(os.path.join(root, "client", "llms.h")) else None


def _checkouts(here):
    """The checkouts whose build/ may hold the library: the one this package sits in
    (python/llmsclient, run in place or installed editable), and the one pip installed it
    from, which pip records beside the installed package (PEP 610 direct_url.json)."""
    roots = [_checkout(os.path.dirname(os.path.dirname(here)))]
    pattern = os.path.join(os.path.dirname(here), "llmsclient-*.dist-info", "direct_url.json")
    for record in sorted(glob.glob(pattern)):
        try:
            with open(record) as f:
                origin = json.load(f)
        except (OSError, ValueError):
            continue
        url = urllib.parse.urlparse(origin.get("url", ""))
        if "dir_info" in origin and url.scheme == "file":
            project = urllib.parse.unquote(url.path)
            roots.append(_checkout(os.path.dirname(os.path.normpath(project))))
    return [r for r in roots if r]


def _candidates():
    """The library's paths, and last a name for the dynamic loader ($LD_LIBRARY_PATH,
    ld.so.cache: a distribution's package), in the order tried."""
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.join(here, "libllmsclient.so")]
    paths += [os.path.join(root, "build", "libllmsclient.so") for root in _checkouts(here)]
    paths += [os.path.join(d, _SONAME) for d in _PREFIX_LIBS]
    paths.append(_SONAME)
    return list(dict.fromkeys(paths))


def _load():
    """The library and the path (or name) it was loaded from."""
    env = os.environ.get("LLMS_CLIENT_LIB")
    tried = []
    for path in [env] if env else _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append("%s: not there" % path)
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s: %s" % (path, e))
    if env:
        raise LibraryNotFoundError(
            "libllmsclient could not be loaded from $LLMS_CLIENT_LIB:\n  %s\nPoint "
            "LLMS_CLIENT_LIB at a built libllmsclient.so (build/libllmsclient.so after make in "
            "an llmsd checkout), or unset it to search the usual places." % tried[0])
    raise LibraryNotFoundError(
        "libllmsclient not found; tried:\n  %s\nSet LLMS_CLIENT_LIB to its path "
        "(build/libllmsclient.so after make in an llmsd checkout), or run make install there "
        "(PREFIX /usr/local or /usr; another PREFIX: set LLMS_CLIENT_LIB to "
        "PREFIX/lib/%s)." % ("\n  ".join(tried), _SONAME))


_lib = None
_lib_path = None


def library_path():
    """The path (or loader name) of the libllmsclient this module uses, loading it when
    no call has yet; LibraryNotFoundError when there is none."""
    _api()
    return _lib_path


def _api():
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    lib, path = _load()
    P, c_char_p, c_int, c_size_t = ctypes.POINTER, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t
    c_uint32 = ctypes.c_uint32
    sigs = {
        "llms_connect": (c_int, [c_char_p, P(ctypes.c_void_p), ctypes.c_char_p]),
        "llms_close": (None, [ctypes.c_void_p]),
        "llms_last_error": (c_char_p, [ctypes.c_void_p]),
        "llms_bind": (c_int, [ctypes.c_void_p, c_char_p]),
        "llms_default_app": (c_char_p, []),
        "llms_params_init": (None, [P(_Params)]),
        "llms_context_create": (c_int, [ctypes.c_void_p, c_char_p, P(_Params), c_char_p]),
        "llms_context_delete": (c_int, [ctypes.c_void_p, c_char_p]),
        "llms_call": (c_int, [ctypes.c_void_p, c_char_p, c_char_p, P(_Params), _TOKEN_CB,
                              ctypes.c_void_p, P(_Result)]),
        "llms_complete": (c_int, [ctypes.c_void_p, c_char_p, c_char_p, c_int, P(_Params),
                                  _TOKEN_CB, ctypes.c_void_p, P(_Result)]),
        "llms_result_free": (None, [P(_Result)]),
        "llms_embed_model": (c_int, [ctypes.c_void_p, c_char_p, P(c_char_p), c_size_t, c_int,
                                     P(_Embeddings)]),
        "llms_embeddings_free": (None, [P(_Embeddings)]),
        "llms_tokenize_model": (c_int, [ctypes.c_void_p, c_char_p, c_char_p, c_int, c_int,
                                        P(P(ctypes.c_int32)), P(c_size_t)]),
        "llms_detokenize_model": (c_int, [ctypes.c_void_p, c_char_p, P(ctypes.c_int32),
                                          c_size_t, P(ctypes.c_void_p)]),
        "llms_free": (None, [ctypes.c_void_p]),
        "llms_rerank_options_init": (None, [P(_RerankOptions)]),
        "llms_rerank": (c_int, [ctypes.c_void_p, c_char_p, P(c_char_p), c_size_t,
                                P(_RerankOptions), P(_RerankResult)]),
        "llms_rerank_result_free": (None, [P(_RerankResult)]),
        "llms_set_timeout": (None, [ctypes.c_void_p, ctypes.c_uint32]),
        "llms_kb_create_opts": (c_int, [ctypes.c_void_p, c_char_p, P(_KbOptions)]),
        "llms_kb_drop": (c_int, [ctypes.c_void_p, c_char_p]),
        "llms_kb_add_progress": (c_int, [ctypes.c_void_p, c_char_p, P(_KbDoc), c_size_t,
                                         _KB_PROGRESS_CB, ctypes.c_void_p, P(c_uint32)]),
        "llms_kb_remove": (c_int, [ctypes.c_void_p, c_char_p, P(c_char_p), c_size_t,
                                   P(c_uint32)]),
        "llms_kb_list": (c_int, [ctypes.c_void_p, P(P(_KbInfo)), P(c_size_t)]),
        "llms_kb_list_free": (None, [P(_KbInfo), c_size_t]),
        "llms_kb_search": (c_int, [ctypes.c_void_p, c_char_p, c_char_p, c_uint32, c_int,
                                   P(P(_KbHit)), P(c_size_t)]),
        "llms_kb_hits_free": (None, [P(_KbHit), c_size_t]),
        "llms_rag_query": (c_int, [ctypes.c_void_p, c_char_p, c_char_p, P(_RagOptions),
                                   _TOKEN_CB, ctypes.c_void_p, P(_RagResult)]),
        "llms_rag_result_free": (None, [P(_RagResult)]),
        "llms_graph_create": (c_int, [ctypes.c_void_p, c_char_p, P(_GraphDef)]),
        "llms_graph_delete": (c_int, [ctypes.c_void_p, c_char_p]),
        "llms_graph_list": (c_int, [ctypes.c_void_p, P(P(_GraphInfo)), P(c_size_t)]),
        "llms_graph_list_free": (None, [P(_GraphInfo), c_size_t]),
        "llms_graph_run_speculate": (c_int, [ctypes.c_void_p, c_char_p, P(_GraphVar), c_size_t,
                                             P(_Params), c_int, _GRAPH_EVENT_CB,
                                             ctypes.c_void_p, P(_GraphResult)]),
        "llms_graph_result_free": (None, [P(_GraphResult)]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    _lib, _lib_path = lib, path
    return lib


def _b(s):
    """s (str, bytes or None) as the library's C string. A NUL is refused: C would end
    the string there and drop the rest without a word."""
    b = s.encode("utf-8") if isinstance(s, str) else s
    if isinstance(b, bytes) and b"\0" in b:
        raise ValueError("llmsclient: a string with a NUL (at byte %d): a C string would "
                         "end there" % b.index(b"\0"))
    return b


def _u32(name, v):
    """v as the library's uint32 count: ctypes would wrap a negative or too large one
    silently (a k of -1 asking for 4294967295 hits)."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 0xFFFFFFFF:
        raise ValueError("llmsclient: %s must be an integer in [0, 4294967295], not %r"
                         % (name, v))
    return v


# llama.cpp's other samplers: the number keywords _params passes on as they are
_NEWER_FLOATS = ("typical_p", "top_n_sigma", "xtc_probability", "xtc_threshold",
                 "dynatemp_range", "dynatemp_exponent", "dry_multiplier", "dry_base",
                 "mirostat_tau", "mirostat_eta")
_NEWER_INTS = ("min_keep", "dry_allowed_length", "dry_penalty_last_n", "mirostat")
# llama.cpp's names of its samplers and their letters, as samplers= takes them
_SAMPLER_LETTERS = {"penalties": "e", "dry": "d", "top_n_sigma": "s", "top_k": "k",
                    "typ_p": "y", "top_p": "p", "min_p": "m", "xtc": "x", "temperature": "t"}


def _newer_samplers(p, keep, samplers, dry_sequence_breakers, numbers):
    """llama.cpp's other samplers into p (what must stay alive into keep)."""
    for name, value in numbers.items():
        if value is not None:
            setattr(p, name, value)
    if dry_sequence_breakers is not None:
        texts = [dry_sequence_breakers] if isinstance(dry_sequence_breakers, str) \
            else list(dry_sequence_breakers)
        arr = (ctypes.c_char_p * len(texts))(*[_b(t) for t in texts])
        p.dry_sequence_breakers = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p))
        p.n_dry_sequence_breakers = len(texts)
        keep.append(arr)
    if samplers is not None:
        if not isinstance(samplers, str):
            unknown = [n for n in samplers if n not in _SAMPLER_LETTERS]
            if unknown:
                raise ValueError("samplers: %r is none of llama.cpp's (%s)"
                                 % (unknown[0], ", ".join(_SAMPLER_LETTERS)))
            samplers = "".join(_SAMPLER_LETTERS[n] for n in samplers)
        text = _b(samplers)
        p.samplers = text
        keep.append(text)


def _params(max_tokens=None, temperature=None, top_p=None, top_k=None, min_p=None,
            repeat_penalty=None, seed=None, stop=None, model=None, speculation=None,
            frequency_penalty=None, presence_penalty=None, logit_bias=None, logprobs=None,
            format=None, grammar=None, ignore_eos=None, samplers=None,
            dry_sequence_breakers=None, **newer):
    """A llms_params with the given fields set, and what keeps its stop strings and
    biases alive. speculation: "off", "lookup", "draft" or "both" (speculative decoding;
    None: the daemon's). logit_bias: {token id: bias in [-100, 100]}, as OpenAI's.
    logprobs: N in [0, 20] puts each generated token's log-probability, with its step's N
    likeliest tokens, in last_result.logprobs. format: "json" (JSON mode: the reply is one
    JSON object), "text", or a JSON Schema (a dict, or its JSON text) the reply must be
    an instance of. grammar: a GBNF grammar (llama.cpp's, start rule root) the reply must
    be a sentence of, instead of a format. ignore_eos=True: the model's end-of-generation
    tokens are never sampled (the reply runs to max_tokens, a stop string or a full
    window). llama.cpp's other samplers under its server's names: min_keep, typical_p,
    top_n_sigma, xtc_probability, xtc_threshold, dynatemp_range, dynatemp_exponent,
    dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n,
    dry_sequence_breakers (a list of texts), mirostat (0, 1, 2), mirostat_tau,
    mirostat_eta; samplers: the order of the chain, llama.cpp's names (["top_k",
    "temperature"]) or letters ("kt")."""
    unknown = set(newer) - set(_NEWER_FLOATS) - set(_NEWER_INTS)
    if unknown:
        raise TypeError("unexpected keyword argument %r" % sorted(unknown)[0])
    p = _Params()
    _api().llms_params_init(ctypes.byref(p))
    if speculation is not None:
        kinds = {"off": 1, "lookup": 2, "draft": 3, "both": 4}
        if speculation not in kinds:
            raise ValueError("speculation must be 'off', 'lookup', 'draft' or 'both'")
        p.speculation = kinds[speculation]
    if model is not None:
        p.model = _b(model)
    if temperature is not None:
        p.temperature = temperature
    if top_p is not None:
        p.top_p = top_p
    if min_p is not None:
        p.min_p = min_p
    if repeat_penalty is not None:
        p.repeat_penalty = repeat_penalty
    if frequency_penalty is not None:
        p.frequency_penalty = frequency_penalty
    if presence_penalty is not None:
        p.presence_penalty = presence_penalty
    keep = []
    _newer_samplers(p, keep, samplers, dry_sequence_breakers, newer)
    if grammar:
        if format is not None:
            raise ValueError("give format= or grammar=, not both")
        text = _b(grammar)
        p.format, p.grammar = 4, text
        keep.append(text)
    elif isinstance(format, dict) or (isinstance(format, str) and format.lstrip().startswith("{")):
        schema = _b(format if isinstance(format, str) else json.dumps(format))
        p.format, p.json_schema = 3, schema
        keep.append(schema)
    elif format is not None:
        formats = {"text": 1, "json": 2}
        if format not in formats:
            raise ValueError("format must be 'text', 'json' or a JSON Schema")
        p.format = formats[format]
    if logprobs is not None:
        p.logprobs, p.top_logprobs = 1, _u32("logprobs", logprobs)
    if ignore_eos:
        p.ignore_eos = 1
    if top_k is not None:
        p.top_k = top_k
    if max_tokens is not None:
        p.max_tokens = max_tokens
    if seed is not None:
        p.has_seed, p.seed = 1, seed
    if stop:
        stops = [stop] if isinstance(stop, str) else list(stop)
        arr = (ctypes.c_char_p * len(stops))(*[_b(s) for s in stops])
        p.stop, p.n_stop = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p)), len(stops)
        keep.append(arr)
    if logit_bias:
        items = list(logit_bias.items())
        for token, _ in items:
            if isinstance(token, bool) or not isinstance(token, int):
                raise ValueError("llmsclient: logit_bias maps token ids (ints) to biases, "
                                 "not %r" % (token,))
            # ctypes would wrap an id past int32 silently into another token's
            if not -2 ** 31 <= token < 2 ** 31:
                raise ValueError("llmsclient: logit_bias token id %d is not an int32" % token)
        arr = (_LogitBias * len(items))(*[_LogitBias(t, b) for t, b in items])
        p.logit_bias, p.n_logit_bias = ctypes.cast(arr, ctypes.c_void_p), len(items)
        keep.append(arr)
    return p, keep


def _sampling(params):
    """_params for the calls whose request carries no model (a RAG query, a graph run):
    they run on the daemon's default generate model, so model= is refused, not ignored."""
    if "model" in params:
        raise TypeError("model=: RAG queries and graph runs use the daemon's default model")
    return _params(**params)


def _s(b):
    return b.decode("utf-8", "replace") if b is not None else None


def _name(names, i):
    return names[i] if 0 <= i < len(names) else "unknown"


def _retrieval(name):
    if name not in RETRIEVALS:
        raise ValueError("retrieval is one of %s, not %r" % (", ".join(RETRIEVALS), name))
    return RETRIEVALS.index(name)


def _result(r):
    text = ctypes.string_at(r.text).decode("utf-8", "replace") if r.text else ""
    lps = None
    if r.logprobs:
        lps = [TokenLogprob(t.token, t.logprob,
                            [(t.top_token[k], t.top_logprob[k]) for k in range(t.n_top)])
               for t in r.logprobs[:r.n_logprobs]]
    return Result(text, r.prompt_tokens, r.generated_tokens, r.context_tokens,
                  _name(STOP_REASONS, r.stop_reason), lps, r.cached_tokens)


def _hits(hits, n):
    return [KbHit(h.passage, _s(h.document), h.seq, h.score, _s(h.text), _s(h.metadata))
            for h in hits[:n]]


def _rag_result(r):
    return RagResult(_s(r.text), _name(RAG_OUTCOMES, r.outcome),
                     _hits(r.passages, r.n_passages), r.prompt_tokens, r.reused_tokens,
                     r.reused_passages, r.generated_tokens, r.retrieve_ms, r.prefill_ms,
                     r.decode_ms, r.queue_ms, _name(STOP_REASONS, r.stop_reason),
                     r.qa_similarity)


# The keys of a graph node's dict that are not sampling fields.
_NODE_KEYS = ("name", "kind", "output", "prompt", "chat", "kb", "query", "top_k", "retrieval")


def _graph_node(node, keep):
    """The llms_graph_node of one node of graph_create's dict; keep holds what it points to."""
    if node.get("kind") not in ("generate", "retrieve"):
        raise ValueError("graph node %r: kind is 'generate' or 'retrieve'" % node.get("name"))
    sampling = {k: v for k, v in node.items() if k not in _NODE_KEYS}
    params = None
    if sampling:
        p, stops = _sampling(sampling)
        params = ctypes.pointer(p)
        keep.append((p, stops))
    text = {k: _b(node.get(k)) for k in ("name", "output", "prompt", "kb", "query")}
    keep.append(text)
    return _GraphNode(text["name"], 1 if node["kind"] == "retrieve" else 0, text["output"],
                      text["prompt"], params, int(bool(node.get("chat"))), text["kb"],
                      text["query"], _u32("top_k", node.get("top_k", 0)),
                      _retrieval(node.get("retrieval", "rrf")))


def _graph_def(graph, keep):
    """The llms_graph_def of graph_create's dict; keep holds what it points to."""
    inputs = [_b(i) for i in graph.get("inputs", [])]
    nodes = [_graph_node(n, keep) for n in graph.get("nodes", [])]
    edges = [_GraphEdge(_b(e.get("from")), _b(e.get("to")), _b(e.get("when")))
             for e in graph.get("edges", [])]
    arrays = ((ctypes.c_char_p * len(inputs))(*inputs), (_GraphNode * len(nodes))(*nodes),
              (_GraphEdge * len(edges))(*edges))
    keep += [inputs, nodes, edges, arrays]
    return _GraphDef(arrays[0], len(inputs), arrays[1], len(nodes), arrays[2], len(edges),
                     _b(graph.get("output")), graph.get("max_steps", 0))


def _graph_event(e):
    return GraphEvent(bool(e.finished), _s(e.node), e.step, _s(e.output), _s(e.value), e.ms,
                      e.generated_tokens, _name(SPECULATIONS, e.speculation))


def _graph_result(r):
    return GraphResult(
        _s(r.output), r.steps, bool(r.capped),
        [GraphTiming(_s(t.node), t.runs, t.ms, t.generated_tokens)
         for t in r.timings[:r.n_timings]],
        {_s(r.state_names[i]): _s(r.state_values[i]) for i in range(r.n_state)},
        r.total_ms, r.queue_ms, r.speculations, r.spec_hits, r.spec_rollbacks, r.spec_saved_ms,
        r.prompt_tokens, r.reused_tokens)


# What a call with a streamed reply fills in: its C result, how that becomes the Python
# value, and the library function that frees it.
_Outcome = namedtuple("_Outcome", "struct convert free")
_GENERATION = _Outcome(_Result, _result, "llms_result_free")
_RAG = _Outcome(_RagResult, _rag_result, "llms_rag_result_free")


class Client:
    """One connection to llmsd, bound to an app (None: as connect() says); .app is the
    name bound. Threads may share it: its calls take turns on the connection, each
    waiting while another thread's call runs (a streamed call until the daemon has sent
    its whole reply, not until it is read). A thread may not call it from a callback of
    one of its calls (progress, on_event), nor while a streamed reply that thread
    started is unfinished: LlmsError FAILED_PRECONDITION at once, where waiting would
    be on the thread itself; use a second Client. last_result is the last call's, of
    whichever thread."""

    def __init__(self, socket_path=None, app=None):
        # The connection carries one call at a time and the library does not lock it:
        # _lock is held for a call's whole exchange, so that threads sharing the client
        # take turns instead of reading each other's frames.
        self._lock = threading.Lock()
        # The thread whose call holds _lock, while that call's callbacks may run on it:
        # a call it makes comes from one of them (a streamed call, on a thread of its
        # own, runs none).
        self._caller = None
        # The streams of this connection, whose running calls close() must end first
        # and whose readers may not call meanwhile; _guard keeps the set whole while
        # threads add to it and look through it.
        self._streams = weakref.WeakSet()
        self._guard = threading.Lock()
        self._closed = False
        lib = _api()
        self._conn = ctypes.c_void_p()
        err = ctypes.create_string_buffer(LLMS_ERROR_MAX)
        rc = lib.llms_connect(_b(socket_path) if socket_path else None,
                              ctypes.byref(self._conn), err)
        if rc != 0:
            raise LlmsError(rc, err.value.decode("utf-8", "replace"))
        self._check(lib.llms_bind(self._conn, _b(app)))
        self.app = app if app is not None else lib.llms_default_app().decode("utf-8")
        self.last_result = None

    def _live(self):
        """The connection's handle; ValueError once close() has begun (the library would
        be handed NULL, and crash on it), also for a call that waited for its turn."""
        if self._closed:
            raise ValueError("llmsclient: the client is closed")
        return self._conn

    def _check(self, rc):
        """LlmsError for a failed status, with the library's message: called in the
        call's turn, before another thread's call replaces that message."""
        if rc != 0:
            msg = _api().llms_last_error(self._conn) if self._conn else b""
            raise LlmsError(rc, (msg or b"").decode("utf-8", "replace"))

    def _refuse_own_wait(self):
        """FAILED_PRECONDITION, before any wait, for a call this thread may not make now.
        From a callback: the call running it holds the connection until the callback
        returns, so the wait would never end. With a streamed reply this thread started
        and has not finished: that call goes first, and this thread would wait for it in
        place of reading it; refused whether or not its call has ended yet, so that the
        same code does the same thing whatever the timing."""
        me = threading.current_thread()
        if self._caller is me:
            raise LlmsError(5, "llmsclient: a callback may not call the client whose call "
                               "runs it; use a second Client")
        with self._guard:
            reading = any(s._owner is me and not s._done for s in self._streams)
        if reading:
            raise LlmsError(5, "llmsclient: a streamed reply this thread started on this "
                               "client is unfinished: read it to its end or close() it "
                               "first, or use a second Client")

    @contextlib.contextmanager
    def _using(self):
        """The connection, this thread's for one call: waits for the turn of any other
        thread's call."""
        self._live()
        self._refuse_own_wait()
        with self._lock:
            self._caller = threading.current_thread()
            try:
                yield self._live()
            finally:
                self._caller = None

    def _call(self, fn, *args):
        """fn(connection, *args), a library call returning a status, in this thread's
        turn; LlmsError when it fails."""
        with self._using() as conn:
            self._check(fn(conn, *args))

    def close(self):
        """Closes the connection: cancels the calls of its streams still running (they
        read it) and waits for a call another thread is making to end; every later
        call, and every call still waiting for its turn, raises ValueError. A callback
        may not close the client whose call runs it (FAILED_PRECONDITION)."""
        if self._caller is threading.current_thread():
            raise LlmsError(5, "llmsclient: a callback may not close the client whose call "
                               "runs it")
        self._closed = True
        with self._guard:
            streams = list(self._streams)
        for stream in streams:
            if stream._thread.is_alive():
                stream.close()
        with self._lock:
            if self._conn:
                _api().llms_close(self._conn)
                self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def set_timeout(self, ms):
        """A deadline in milliseconds for every later request (0: none)."""
        ms = _u32("ms", ms)
        with self._using() as conn:
            _api().llms_set_timeout(conn, ms)

    def _reply(self, call, stream, outcome):
        """Runs call(connection, on_text, result) returning a status: with stream an
        iterator of the reply's pieces, else the reply as outcome converts it;
        last_result either way."""
        if stream:
            self._live()
            self._refuse_own_wait()
            s = _Stream(self, call, outcome)
            with self._guard:
                self._streams.add(s)
            return s
        res = outcome.struct()
        try:
            with self._using() as conn:
                self._check(call(conn, _TOKEN_CB(0), ctypes.byref(res)))
                reply = self.last_result = outcome.convert(res)
        finally:
            getattr(_api(), outcome.free)(ctypes.byref(res))
        return reply

    def _generate(self, call, stream):
        """The reply's text, or with stream an iterator of its pieces."""
        r = self._reply(call, stream, _GENERATION)
        return r if stream else r.text

    def complete(self, prompt, max_tokens=None, temperature=None, system=None, chat=False,
                 stream=False, **params):
        """Stateless generation: the text (or with stream=True an iterator of pieces).
        chat: wrap the prompt as a user message (after system) in the chat template."""
        p, keep = _params(max_tokens=max_tokens, temperature=temperature, **params)

        def call(conn, cb, res):
            return _api().llms_complete(conn, _b(prompt), _b(system) if system else None,
                                        1 if chat or system else 0, ctypes.byref(p), cb, None,
                                        res)
        call.keep = keep
        return self._generate(call, stream)

    def create_context(self, system=None, **defaults):
        """A new persistent context (its defaults: max_tokens, temperature, ...; model: a
        generate model of the daemon's registry by name)."""
        p, keep = _params(**defaults)
        cid = ctypes.create_string_buffer(LLMS_ID_MAX)
        self._call(_api().llms_context_create, _b(system) if system else None,
                   ctypes.byref(p), cid)
        del keep
        return Context(self, cid.value.decode())

    def context(self, context_id):
        """An existing context of this app by id."""
        return Context(self, context_id)

    def embed(self, texts, pooling=None, model=None):
        """One unit-length vector (a list of floats) per text; a str is one text. model: an
        embed model of the daemon's registry by name (None: the default). pooling: "last",
        "mean" or "cls"; None: the model's own (its file's pooling_type, else the last
        token on a decoder, CLS on an encoder)."""
        poolings = {None: -1, "last": 0, "mean": 1, "cls": 2}
        if pooling not in poolings:
            raise ValueError("pooling must be None, 'last', 'mean' or 'cls'")
        if isinstance(texts, (str, bytes)):
            texts = [texts]
        arr = (ctypes.c_char_p * len(texts))(*[_b(t) for t in texts])
        e = _Embeddings()
        self._call(_api().llms_embed_model, _b(model) if model else None, arr, len(texts),
                   poolings[pooling], ctypes.byref(e))
        try:
            d = e.dim
            flat = e.values[:e.n * d]  # one copy in C, not a ctypes index per float
            return [flat[i * d:(i + 1) * d] for i in range(e.n)]
        finally:
            _api().llms_embeddings_free(ctypes.byref(e))

    def tokenize(self, text, add_special=False, parse_special=False, model=None):
        """The token ids of text with a model's tokenizer (None: the default generate
        model's): the ids logit_bias names. add_special adds BOS etc. as the model wants;
        parse_special reads text like "<|im_start|>" as special tokens."""
        ids, n = ctypes.POINTER(ctypes.c_int32)(), ctypes.c_size_t()
        self._call(_api().llms_tokenize_model, _b(model) if model else None, _b(text),
                   int(bool(add_special)), int(bool(parse_special)), ctypes.byref(ids),
                   ctypes.byref(n))
        try:
            return ids[:n.value]
        finally:
            _api().llms_free(ids)

    def detokenize(self, ids, model=None):
        """The text of token ids (a model's, None: the default generate model's)."""
        ids = list(ids)
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or not -2**31 <= t < 2**31:
                raise ValueError("llmsclient: token ids are int32 integers, not %r" % (t,))
        arr = (ctypes.c_int32 * len(ids))(*ids)
        text = ctypes.c_void_p()
        self._call(_api().llms_detokenize_model, _b(model) if model else None, arr, len(ids),
                   ctypes.byref(text))
        try:
            return ctypes.string_at(text.value).decode("utf-8", "replace")
        finally:
            _api().llms_free(text)

    def rerank(self, query, documents, k=5, ordered=True, model=None):
        """The k best documents for query, best first: [RerankHit(index, score)]. model: a
        rerank model of the daemon's registry by name (None: the default)."""
        arr = (ctypes.c_char_p * len(documents))(*[_b(d) for d in documents])
        o = _RerankOptions()
        _api().llms_rerank_options_init(ctypes.byref(o))
        model_b = _b(model) if model else None
        o.model = model_b
        o.top_k = _u32("k", k)
        o.mode = 1 if ordered else 0
        r = _RerankResult()
        self._call(_api().llms_rerank, _b(query), arr, len(documents), ctypes.byref(o),
                   ctypes.byref(r))
        try:
            return [RerankHit(r.hits[i].index,
                              None if math.isnan(r.hits[i].score) else r.hits[i].score)
                    for i in range(r.n_hits)]
        finally:
            _api().llms_rerank_result_free(ctypes.byref(r))

    def kb_create(self, name, passage_tokens=0, overlap_tokens=0, share_uid=False,
                  embed_model=None):
        """Creates the app's knowledge base name: passages of passage_tokens tokens
        overlapping by overlap_tokens (0: the daemon's defaults). share_uid: its RAG
        caches are shared with the other apps of your uid whose knowledge bases are
        shared too (never with another uid). embed_model: the registry's embed model that
        embeds it for its life (None: the default embed model). FAILED_PRECONDITION when
        it exists."""
        o = _KbOptions(passage_tokens, overlap_tokens, 1 if share_uid else 0,
                       _b(embed_model) if embed_model else None)
        self._call(_api().llms_kb_create_opts, _b(name), ctypes.byref(o))

    def kb_drop(self, name):
        """Deletes knowledge base name with its documents and cached answers."""
        self._call(_api().llms_kb_drop, _b(name))

    def kb_add(self, kb, documents, progress=None):
        """Adds documents, visible together and durable once this returns (none of them
        when it raises); the number of passages they made. documents: {id: text}, or
        (id, text) or (id, text, metadata) tuples. A document replaces the one of its id.
        progress(KbProgress) hears the add's progress (phase "split", "embed" or "write",
        counts that only grow) at most about 4 times a second and once all is written;
        a true return cancels the add (CANCELLED), and an exception it raises cancels
        the add and comes out of kb_add."""
        items = list(documents.items()) if isinstance(documents, Mapping) else list(documents)
        docs = (_KbDoc * len(items))(*[_KbDoc(*[_b(v) for v in d]) for d in items])
        passages = ctypes.c_uint32()
        raised = []

        def heard(p, user):
            try:
                q = p.contents
                return 1 if progress(KbProgress(
                    _name(KB_PHASES, q.phase), q.documents, q.documents_written, q.bytes,
                    q.bytes_split, q.passages, q.passages_embedded, q.passages_written)) else 0
            except BaseException as e:
                raised.append(e)
                return 1
        cb = _KB_PROGRESS_CB(heard) if progress else _KB_PROGRESS_CB(0)
        with self._using() as conn:
            rc = _api().llms_kb_add_progress(conn, _b(kb), docs, len(items), cb, None,
                                             ctypes.byref(passages))
            if raised:
                raise raised[0]
            self._check(rc)
        return passages.value

    def kb_remove(self, kb, ids):
        """Removes documents by id (a str is one id); how many of them existed."""
        ids = [ids] if isinstance(ids, (str, bytes)) else list(ids)
        arr = (ctypes.c_char_p * len(ids))(*[_b(i) for i in ids])
        removed = ctypes.c_uint32()
        self._call(_api().llms_kb_remove, _b(kb), arr, len(ids), ctypes.byref(removed))
        return removed.value

    def kb_list(self):
        """The app's knowledge bases by name: [KbInfo]."""
        kbs, n = ctypes.POINTER(_KbInfo)(), ctypes.c_size_t()
        self._call(_api().llms_kb_list, ctypes.byref(kbs), ctypes.byref(n))
        try:
            return [KbInfo(_s(k.name), k.documents, k.passages, k.bytes, k.passage_tokens,
                           k.overlap_tokens, k.qa_entries, bool(k.share_uid),
                           _s(k.embed_model))
                    for k in kbs[:n.value]]
        finally:
            _api().llms_kb_list_free(kbs, n.value)

    def kb_search(self, kb, query, k=0, retrieval="rrf"):
        """The k best passages of kb for query (0: the daemon's rag_top_k), best first:
        [KbHit]. retrieval: one of RETRIEVALS."""
        hits, n = ctypes.POINTER(_KbHit)(), ctypes.c_size_t()
        self._call(_api().llms_kb_search, _b(kb), _b(query), _u32("k", k), _retrieval(retrieval),
                   ctypes.byref(hits), ctypes.byref(n))
        try:
            return _hits(hits, n.value)
        finally:
            _api().llms_kb_hits_free(hits, n.value)

    def rag(self, kb, question, stream=False, top_k=0, retrieval="rrf", system=None,
            no_qa=False, no_qkv=False, share_system_uid=False, max_tokens=None,
            temperature=None, **params):
        """Answers question from knowledge base kb: a RagResult (the answer, the passages
        it was given, how the caches served it, the times), or with stream=True an
        iterator of the answer's pieces, after which last_result is the RagResult.
        top_k: passages (0: the daemon's rag_top_k); system: None for the daemon's
        rag_system_prompt; no_qa, no_qkv: bypass the QA bank, the QKV tree;
        share_system_uid: the system prompt's cached KV is shared with your uid's other apps
        that ask so."""
        p, keep = _sampling(dict(params, max_tokens=max_tokens, temperature=temperature))
        o = _RagOptions(_u32("top_k", top_k), _retrieval(retrieval), _b(system) if system else None,
                        ctypes.pointer(p), int(no_qa), int(no_qkv), int(share_system_uid))

        def call(conn, cb, res):
            return _api().llms_rag_query(conn, _b(kb), _b(question), ctypes.byref(o), cb,
                                         None, res)
        call.keep = keep
        return self._reply(call, stream, _RAG)

    def graph_create(self, name, graph):
        """Creates the app's workflow graph name from graph, a dict in the JSON form that
        `llms graph create` reads (json.load of such a file does):

            {"inputs": ["question"], "output": "answer", "max_steps": 8,
             "nodes": [{"name": "n", "kind": "generate" | "retrieve", "output": "var",
                        "prompt": "...", "chat": False, "temperature": 0, ...,
                        "kb": "...", "query": "...", "top_k": 3, "retrieval": "rrf"}],
             "edges": [{"from": "START", "to": "n", "when": "..."}]}

        A generation node takes the sampling fields complete() does. The daemon refuses
        a malformed graph (INVALID_ARGUMENT, naming the node); FAILED_PRECONDITION when
        the app has a graph of that name or it is a built-in's."""
        keep = []
        d = _graph_def(graph, keep)
        self._call(_api().llms_graph_create, _b(name), ctypes.byref(d))

    def graph_delete(self, name):
        """Deletes the app's graph name."""
        self._call(_api().llms_graph_delete, _b(name))

    def graph_list(self):
        """The built-in templates, then the app's graphs by name: [GraphInfo]."""
        graphs, n = ctypes.POINTER(_GraphInfo)(), ctypes.c_size_t()
        self._call(_api().llms_graph_list, ctypes.byref(graphs), ctypes.byref(n))
        try:
            return [GraphInfo(_s(g.name), bool(g.builtin),
                              [_s(i) for i in g.inputs[:g.n_inputs]], g.n_nodes, g.n_edges,
                              _s(g.output), g.max_steps) for g in graphs[:n.value]]
        finally:
            _api().llms_graph_list_free(graphs, n.value)

    def graph_run(self, graph, inputs, on_event=None, speculate=None, max_tokens=None,
                  temperature=None, **params):
        """Runs graph (the app's, or a built-in template: "one-shot", "hyde", "multistep",
        "irg", "recomp", whose inputs are "question" and "kb") with inputs, a dict of
        variables; a GraphResult (output, state as a dict, per-node timings, ...).
        on_event(GraphEvent) hears each node start and finish; a true return cancels
        the run (CANCELLED), and an exception it raises cancels the run and comes out
        of graph_run. speculate: None for the daemon's setting, else on or off.
        Sampling fields go over every generation node's own."""
        names = list(inputs)
        vars_ = (_GraphVar * len(names))(*[_GraphVar(_b(k), _b(inputs[k])) for k in names])
        p, keep = _sampling(dict(params, max_tokens=max_tokens, temperature=temperature))
        raised = []

        def heard(event, user):
            try:
                return 1 if on_event(_graph_event(event.contents)) else 0
            except BaseException as e:
                raised.append(e)
                return 1
        cb = _GRAPH_EVENT_CB(heard) if on_event else _GRAPH_EVENT_CB(0)
        spec = 0 if speculate is None else 1 if speculate else 2
        r = _GraphResult()
        try:
            with self._using() as conn:
                rc = _api().llms_graph_run_speculate(conn, _b(graph), vars_, len(names),
                                                     ctypes.byref(p), spec, cb, None,
                                                     ctypes.byref(r))
                del keep
                if raised:
                    raise raised[0]
                self._check(rc)
            return _graph_result(r)
        finally:
            _api().llms_graph_result_free(ctypes.byref(r))


class _Stream:
    """The pieces of a streamed reply. The blocking call runs on a thread of its own and
    hands pieces over a queue; it holds the client's connection until the call ends,
    not until the pieces are read. Closing the iterator early, or dropping it
    unfinished (a break out of a for loop, an exception through one), cancels the call
    and waits for it to end, so that the connection is free for the next. Until then
    the thread that started it (_owner) may not call the client (_refuse_own_wait)."""

    _END = object()

    def __init__(self, client, call, outcome):
        # The thread holds none of self, so that dropping the iterator reaches __del__
        # while the call runs; failure gets what the call raised or returned.
        q, stop, failure = queue.Queue(), threading.Event(), []
        self._q, self._stop, self._failure, self._done = q, stop, failure, False
        self._owner = threading.current_thread()

        def on_text(text, n, user):
            q.put(ctypes.string_at(text, n).decode("utf-8", "replace"))
            return 1 if stop.is_set() else 0
        cb = _TOKEN_CB(on_text)

        def run():
            res = outcome.struct()
            try:
                with client._lock:
                    # Cancelled (closed, or its client closed) while it waited for its
                    # turn: it never starts.
                    if not stop.is_set():
                        rc = call(client._live(), cb, ctypes.byref(res))
                        if not (rc == 6 and stop.is_set()):
                            client._check(rc)
                            client.last_result = outcome.convert(res)
            except BaseException as e:
                failure.append(e)
            finally:
                getattr(_api(), outcome.free)(ctypes.byref(res))
                q.put(_Stream._END)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        try:
            item = self._q.get()
        except BaseException:
            # A KeyboardInterrupt while waiting: the call must not run on behind it.
            self.close()
            raise
        if item is self._END:
            self._done = True
            self._thread.join()
            if self._failure:
                raise self._failure[0]
            raise StopIteration
        return item

    def close(self):
        """Cancels the call (when still running) and waits for it to end; the iterator
        then ends."""
        self._stop.set()
        self._thread.join()
        self._done = True

    def __del__(self):
        if self._thread.is_alive():
            self.close()


class Context:
    """A persistent context of the client's app: calls extend its conversation."""

    def __init__(self, client, context_id):
        self.client = client
        self.id = context_id

    def call(self, prompt, stream=False, max_tokens=None, temperature=None, **params):
        """One user turn: the reply's text, or with stream=True an iterator of pieces."""
        p, keep = _params(max_tokens=max_tokens, temperature=temperature, **params)
        c = self.client

        def call(conn, cb, res):
            return _api().llms_call(conn, _b(self.id), _b(prompt), ctypes.byref(p), cb, None,
                                    res)
        call.keep = keep
        return c._generate(call, stream)

    def delete(self):
        self.client._call(_api().llms_context_delete, _b(self.id))


def connect(socket_path=None, app=None):
    """A client bound to app on llmsd's socket (None: $LLMS_SOCKET, else the default).
    app None: $LLMS_APP when set and not empty, else "default", the app every llmsd client
    (llms, the C library, the HTTP gateway) uses when given none, so that what one makes
    the others find."""
    return Client(socket_path, app)
