"""The Python client against a real llmsd (started by tests/integration/test_python.c,
which sets LLMS_SOCKET, LLMS_CLIENT_LIB and LLMS_CLI, the path of this build's llms).
Standard library only."""
import ctypes
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
import llmsclient  # noqa: E402



def status_of(test, call, *args, **kwargs):
    """The status name of the LlmsError call raises, after checking it carries the
    library's message (llms_last_error) too."""
    with test.assertRaises(llmsclient.LlmsError) as e:
        result = call(*args, **kwargs)
        if hasattr(result, "__next__"):
            list(result)   # a streamed reply fails while it is read
    test.assertRegex(str(e.exception), "^%s: .+" % e.exception.status_name)
    return e.exception.status_name


def next_within(it, seconds):
    """next(it), or "ended" at its end, or "hung" when it has neither after seconds."""
    got = []
    t = threading.Thread(target=lambda: got.append(next(it, "ended")), daemon=True)
    t.start()
    t.join(seconds)
    return got[0] if got else "hung"


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.c = llmsclient.connect(app="pytest")

    def tearDown(self):
        self.c.close()

    def test_complete_is_deterministic_when_greedy(self):
        a = self.c.complete("one two three", max_tokens=8, temperature=0)
        b = self.c.complete("one two three", max_tokens=8, temperature=0)
        self.assertIsInstance(a, str)
        self.assertEqual(a, b)
        self.assertLessEqual(self.c.last_result.generated_tokens, 8)
        self.assertIn(self.c.last_result.stop_reason, ("eos", "max_tokens"))

    def test_logit_bias_and_penalties_reach_the_sampler(self):
        plain = self.c.complete("one two three", max_tokens=12, temperature=0)
        self.assertTrue(plain.startswith("tok"), plain)
        first = int("".join(ch for ch in plain[3:8] if ch.isdigit()) or "0")
        banned = self.c.complete("one two three", max_tokens=12, temperature=0,
                                 logit_bias={first: -100})
        self.assertFalse(banned.startswith("tok%d" % first)
                         and not banned[3 + len(str(first))].isdigit(), banned)
        penalties = dict(frequency_penalty=2.0, presence_penalty=1.0)
        with_defaults = self.c.create_context(**penalties)
        per_call, unpenalised = self.c.create_context(), self.c.create_context()
        a = with_defaults.call("one two three", max_tokens=12, temperature=0)
        b = per_call.call("one two three", max_tokens=12, temperature=0, **penalties)
        c = unpenalised.call("one two three", max_tokens=12, temperature=0)
        self.assertEqual(a, b)
        self.assertNotEqual(a, c)
        for ctx in (with_defaults, per_call, unpenalised):
            ctx.delete()
        with self.assertRaises(ValueError):
            self.c.complete("x", logit_bias={"7": 1.0})
        # an id past int32 is refused, not wrapped by ctypes into another token's id (2**32
        # + first would ban first)
        with self.assertRaises(ValueError):
            self.c.complete("x", max_tokens=1, logit_bias={2 ** 32 + first: -100})
        with self.assertRaises(llmsclient.LlmsError) as e:
            self.c.complete("x", logit_bias={7: 500.0})
        self.assertEqual(e.exception.status_name, "INVALID_ARGUMENT")

    def test_logprobs_come_with_the_result(self):
        text = self.c.complete("one two three", max_tokens=6, temperature=0, logprobs=2)
        r = self.c.last_result
        self.assertEqual(len(r.logprobs), r.generated_tokens)
        for t in r.logprobs:
            self.assertLessEqual(t.logprob, 0.0)
            self.assertEqual(len(t.top), 2)
            # greedy takes the likeliest
            self.assertEqual(t.top[0][0], t.token)
            self.assertAlmostEqual(t.top[0][1], t.logprob, places=5)
        self.assertTrue(text)
        self.c.complete("one two three", max_tokens=2)
        self.assertIsNone(self.c.last_result.logprobs)
        with self.assertRaises(llmsclient.LlmsError) as e:
            self.c.complete("x", logprobs=21)
        self.assertEqual(e.exception.status_name, "INVALID_ARGUMENT")

    def test_json_format_reaches_the_daemon(self):
        # the test model's vocabulary ("tokN") has no token that begins a JSON object:
        # the daemon says so, which shows the format arrived
        with self.assertRaises(llmsclient.LlmsError) as e:
            self.c.complete("x", max_tokens=4, format="json")
        self.assertEqual(e.exception.status_name, "FAILED_PRECONDITION")
        self.assertIn("JSON", str(e.exception))
        self.assertIsInstance(self.c.complete("x", max_tokens=2, format="text"), str)
        with self.assertRaises(ValueError):
            self.c.complete("x", format="yaml")

    def test_json_schema_format_reaches_the_daemon(self):
        # as above, the test vocabulary cannot begin the object: the daemon compiled the
        # schema (a bad one is INVALID_ARGUMENT naming the keyword) and tried
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
        for fmt in (schema, json.dumps(schema)):
            with self.assertRaises(llmsclient.LlmsError) as e:
                self.c.complete("x", max_tokens=4, format=fmt)
            self.assertEqual(e.exception.status_name, "FAILED_PRECONDITION")
        with self.assertRaises(llmsclient.LlmsError) as e:
            self.c.complete("x", max_tokens=4, format={"type": "array", "uniqueItems": True})
        self.assertEqual(e.exception.status_name, "INVALID_ARGUMENT")
        self.assertIn("'uniqueItems'", str(e.exception))

    def test_grammar_reaches_the_daemon(self):
        # the test vocabulary's tokens are "tokN": a grammar of them is followed
        grammar = 'root ::= ("tok" [0-9]{1,5}){1,3}\n'
        text = self.c.complete("one two three", max_tokens=3, temperature=0, grammar=grammar)
        self.assertRegex(text, r"^(tok[0-9]{1,5}){1,3}$")
        with self.assertRaises(llmsclient.LlmsError) as e:
            self.c.complete("x", max_tokens=2, grammar="root ::= item\n")
        self.assertEqual(e.exception.status_name, "INVALID_ARGUMENT")
        self.assertIn("item", str(e.exception))
        with self.assertRaises(ValueError):
            self.c.complete("x", format="json", grammar=grammar)

    def test_ignore_eos_runs_to_max_tokens(self):
        # the end of text all but forced: a reply ends at once, unless ignore_eos bans it
        eos = self.c.tokenize("</s>", parse_special=True)
        self.assertEqual(len(eos), 1)
        self.c.complete("one two three", max_tokens=4, logit_bias={eos[0]: 100})
        self.assertEqual(self.c.last_result.generated_tokens, 0)
        self.c.complete("one two three", max_tokens=4, logit_bias={eos[0]: 100},
                        ignore_eos=True)
        self.assertEqual(self.c.last_result.generated_tokens, 4)

    def test_llama_cpp_samplers_reach_the_sampler(self):
        # each is sent, checked and applied: it changes a seeded reply
        base = dict(max_tokens=16, temperature=1, top_k=0, top_p=1, min_p=0, seed=11)
        plain = self.c.complete("one two three", **base)
        for newer in (dict(mirostat=2, mirostat_tau=3.0, mirostat_eta=0.2),
                      dict(mirostat=1),
                      dict(typical_p=0.3, min_keep=2),
                      dict(xtc_probability=1.0, xtc_threshold=0.0),
                      dict(top_n_sigma=0.5),
                      dict(dynatemp_range=0.9, dynatemp_exponent=2.0),
                      dict(dry_multiplier=2.0, dry_base=3.0, dry_allowed_length=0,
                           dry_penalty_last_n=-1, dry_sequence_breakers=["tok1"]),
                      dict(temperature=5, samplers="tp"),
                      dict(temperature=5, samplers=["temperature", "top_p"])):
            self.assertNotEqual(self.c.complete("one two three", **dict(base, **newer)),
                                plain, newer)
        # out of their ranges: the daemon's refusal; a sampler twice: the library's
        self.assertEqual(status_of(self, self.c.complete, "x", mirostat=3), "INVALID_ARGUMENT")
        self.assertEqual(status_of(self, self.c.complete, "x", typical_p=1.5), "INVALID_ARGUMENT")
        self.assertEqual(status_of(self, self.c.complete, "x", samplers="kk"), "INVALID_ARGUMENT")
        with self.assertRaises(ValueError):
            self.c.complete("x", samplers=["top_k", "nucleus"])
        with self.assertRaises(TypeError):
            self.c.complete("x", mirostat_lr=0.1)

    def test_cached_tokens_come_with_the_result(self):
        prompt = "one two three four five six seven eight nine ten " * 4
        self.c.complete(prompt, max_tokens=1, temperature=0)
        self.c.complete(prompt, max_tokens=1, temperature=0)
        r = self.c.last_result
        self.assertGreater(r.cached_tokens, 0)
        self.assertLess(r.cached_tokens, r.prompt_tokens)

    def test_tokenize_and_detokenize(self):
        ids = self.c.tokenize("one two three")
        self.assertTrue(ids and all(isinstance(t, int) for t in ids))
        self.assertEqual(len(self.c.tokenize("one two three", add_special=True)), len(ids) + 1)
        self.assertEqual(self.c.detokenize([]), "")
        # a reply's own ids (its logprobs name them) spell it back
        text = self.c.complete("one two three", max_tokens=4, temperature=0, logprobs=0)
        reply = [t.token for t in self.c.last_result.logprobs]
        self.assertEqual(self.c.detokenize(reply), text)
        # and banning the first of them changes the reply
        again = self.c.complete("one two three", max_tokens=4, temperature=0,
                                logit_bias={reply[0]: -100})
        self.assertNotEqual(again, text)
        with self.assertRaises(llmsclient.LlmsError) as e:
            self.c.detokenize([10 ** 6])
        self.assertEqual(e.exception.status_name, "INVALID_ARGUMENT")
        with self.assertRaises(ValueError):
            self.c.detokenize([2 ** 40])

    def test_streamed_call_equals_whole_call(self):
        s = self.c.create_context(system="You answer.")
        w = self.c.create_context(system="You answer.")
        pieces = list(s.call("hello", stream=True, max_tokens=10, temperature=0))
        whole = w.call("hello", max_tokens=10, temperature=0)
        self.assertTrue(all(isinstance(p, str) for p in pieces))
        self.assertEqual("".join(pieces), whole)
        # The context goes on with a second turn.
        self.assertIsInstance(s.call("more", max_tokens=4), str)
        self.assertGreater(self.c.last_result.context_tokens, 0)
        s.delete()
        w.delete()

    def test_leaving_a_stream_cancels_it(self):
        ctx = self.c.create_context()
        it = ctx.call("go on", stream=True, max_tokens=400, temperature=0)
        next(it, None)
        it.close()
        # The connection is still usable afterwards.
        self.assertIsInstance(self.c.complete("x", max_tokens=2), str)

    def test_a_finished_stream_stays_finished(self):
        it = self.c.complete("one two three", stream=True, max_tokens=4, temperature=0)
        self.assertTrue(list(it))
        # The iterator protocol: past its end next() raises StopIteration again (it
        # waited forever on the empty queue), and a second loop sees nothing.
        self.assertEqual(next_within(it, 5), "ended")
        self.assertEqual(list(it), [])

    def test_what_a_streamed_call_raises_comes_out_of_the_stream(self):
        # The call runs on the stream's thread: a bad argument raised there, and the
        # stream used to end empty with the traceback on stderr.
        with self.assertRaises(ctypes.ArgumentError):
            list(self.c.complete(42, stream=True))
        self.assertIsInstance(self.c.complete("x", max_tokens=2), str)

    def test_a_stream_left_unfinished_is_cancelled(self):
        # A break out of the loop (or an exception through it) drops the iterator: the
        # call must end there, not run on and meet the next call on the connection
        # (both then read its socket: the next call hung).
        ctx = self.c.create_context()
        threads = threading.active_count()
        for _ in ctx.call("go on", stream=True, max_tokens=450, temperature=0):
            break
        self.assertEqual(threading.active_count(), threads, "the call runs on")
        with self.assertRaises(KeyError):
            for _ in ctx.call("go on", stream=True, max_tokens=450, temperature=0):
                raise KeyError("in the loop")
        self.assertEqual(threading.active_count(), threads, "the call runs on")
        self.assertIsInstance(self.c.complete("x", max_tokens=2), str)
        ctx.delete()

    def test_a_closed_client_raises(self):
        # In a fresh interpreter: the library was handed the closed (NULL) connection,
        # or a stream went on reading the freed one, and the process died of SIGSEGV.
        code = ("import llmsclient\n"
                "with llmsclient.connect(app='pytest') as c:\n"
                "    it = c.complete('one two three', stream=True, max_tokens=450)\n"
                "list(it)\n"
                "for call in (lambda: c.complete('x'), lambda: c.set_timeout(5),\n"
                "             lambda: c.kb_list(), lambda: c.context('x').call('x'),\n"
                "             lambda: list(c.complete('x', stream=True))):\n"
                "    try:\n"
                "        call()\n"
                "    except ValueError as e:\n"
                "        print(e)\n")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
        self.assertEqual(r.returncode, 0, r.stderr)
        # close() cancelled the stream still running; every later call is refused.
        self.assertEqual(r.stdout, "llmsclient: the client is closed\n" * 5)

    def test_a_nul_in_a_string_is_refused(self):
        # A C string ends at its first NUL: the rest was dropped without a word (the
        # prompt "one\0two" was "one", a document's text cut short).
        calls = [lambda: self.c.complete("one\0two", max_tokens=1),
                 lambda: self.c.complete(b"one\0two", max_tokens=1),
                 lambda: list(self.c.complete("one\0two", stream=True, max_tokens=1)),
                 lambda: self.c.complete("x", stop=["a\0b"], max_tokens=1),
                 lambda: self.c.embed(["a text", "a\0b"]),
                 lambda: self.c.kb_create("notes", embed_model="a\0b")]
        for call in calls:
            with self.assertRaisesRegex(ValueError, "NUL"):
                call()

    def test_embed(self):
        v = self.c.embed(["first", "second text"])
        self.assertEqual(len(v), 2)
        for row in v:
            self.assertAlmostEqual(math.sqrt(sum(x * x for x in row)), 1.0, places=4)
        self.assertEqual(self.c.embed("first"), v[:1])

    def test_counts_are_not_wrapped(self):
        # ctypes turned -1 into 4294967295: a k asking for every hit, a timeout of 49 days
        calls = [lambda: self.c.rerank("cat", ["a cat"], k=-1),
                 lambda: self.c.kb_search("notes", "q", k=-1),
                 lambda: self.c.rag("notes", "q", top_k=-2),
                 lambda: self.c.set_timeout(-5),
                 lambda: self.c.set_timeout(2 ** 32),
                 lambda: self.c.rerank("cat", ["a cat"], k=1.5)]
        for call in calls:
            with self.assertRaisesRegex(ValueError, "integer in"):
                call()
        self.c.set_timeout(0)

    def test_rerank(self):
        docs = ["a cat", "a dog", "cats and dogs", "nothing"]
        hits = self.c.rerank("cat", docs, k=2)
        self.assertEqual(len(hits), 2)
        for h in hits:
            self.assertIn(h.index, range(len(docs)))
            self.assertTrue(0.0 <= h.score <= 1.0)
        self.assertGreaterEqual(hits[0].score, hits[1].score)

    def test_errors_carry_the_status(self):
        with self.assertRaises(llmsclient.LlmsError) as e:
            self.c.complete("x", top_p=7.0)
        self.assertEqual(e.exception.status, 1)
        self.assertEqual(e.exception.status_name, "INVALID_ARGUMENT")
        with self.assertRaises(llmsclient.LlmsError) as e:
            self.c.context("0" * 32).call("x")
        self.assertEqual(e.exception.status, 2)
        with self.assertRaises(llmsclient.LlmsError) as e:
            list(self.c.context("0" * 32).call("x", stream=True))
        self.assertEqual(e.exception.status_name, "NOT_FOUND")
        with self.assertRaises(llmsclient.LlmsError) as e:
            self.c.embed("x", model="nope")
        self.assertEqual(e.exception.status_name, "NOT_FOUND")
        with self.assertRaises(llmsclient.LlmsError) as e:
            self.c.complete("x", model="nope")
        self.assertEqual(e.exception.status_name, "NOT_FOUND")
        with self.assertRaises(llmsclient.LlmsError) as e:
            llmsclient.connect(socket_path="/nonexistent/llmsd.sock")
        self.assertEqual(e.exception.status, 100)


def on_threads(test, calls, seconds=30):
    """Runs each of calls on a thread of its own; what each returned or raised, in order.
    Fails the test when one has not ended after seconds (a hang is a failure, not a wait
    for ever)."""
    got = [None] * len(calls)

    def run(i):
        try:
            got[i] = ("ok", calls[i]())
        except BaseException as e:
            got[i] = ("raised", e)
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + seconds
    for t in threads:
        t.join(max(0, deadline - time.monotonic()))
    test.assertFalse([t for t in threads if t.is_alive()], "a call hung")
    return got


class SharedClientTest(unittest.TestCase):
    """One Client used by several threads: web handlers and thread pools share one. Its
    calls took turns on the connection only by chance, and otherwise read each other's
    frames: LlmsError PROTOCOL "undecodable frame", a call that hung, or a crash."""

    def setUp(self):
        self.c = llmsclient.connect(app="pytest")

    def tearDown(self):
        # Guarded too: a connection out of step can hang close() as well.
        on_threads(self, [self.c.close], 20)

    def test_threads_share_one_client(self):
        prompts = ["one two three %d" % i for i in range(8)]
        want = {p: (self.c.complete(p, max_tokens=4, temperature=0), self.c.embed(p))
                for p in prompts}

        def calls(p):
            return [(self.c.complete(p, max_tokens=4, temperature=0), self.c.embed(p))
                    for _ in range(15)]
        got = on_threads(self, [lambda p=p: calls(p) for p in prompts])
        for p, (how, value) in zip(prompts, got):
            self.assertEqual(how, "ok", value)
            self.assertEqual(value, [want[p]] * 15)

    def refused(self, call):
        """The message of the FAILED_PRECONDITION call raises."""
        with self.assertRaises(llmsclient.LlmsError) as e:
            call()
        self.assertEqual(e.exception.status_name, "FAILED_PRECONDITION")
        return str(e.exception)

    def test_a_call_from_the_thread_reading_a_stream_is_refused(self):
        # The thread that started a stream and has not finished it calls the client: the
        # call met the stream's on the connection (PROTOCOL, or a hang). It is refused at
        # once, every time: waiting would hold the thread up for the whole of a call it
        # has yet to read, and only while that call still ran.
        whole = self.c.complete("go on", max_tokens=40, temperature=0)

        def reader():
            it = self.c.complete("go on", stream=True, max_tokens=40, temperature=0)
            first = next(it)
            started = time.monotonic()
            messages = [self.refused(call) for call in (
                lambda: self.c.complete("x", max_tokens=2), lambda: self.c.embed("x"),
                lambda: self.c.complete("x", stream=True, max_tokens=2),
                lambda: self.c.context("0" * 32).call("x", max_tokens=2))]
            self.assertLess(time.monotonic() - started, 5, "refused only after a wait")
            # The stream goes on, whole, and once read the client takes calls again.
            text = first + "".join(it)
            after = self.c.complete("x", max_tokens=2)
            # So does one closed early.
            it = self.c.complete("go on", stream=True, max_tokens=40, temperature=0)
            next(it)
            self.refused(lambda: self.c.embed("x"))
            it.close()
            return messages, text, after, self.c.embed("x")
        [(how, value)] = on_threads(self, [reader])
        self.assertEqual(how, "ok", value)
        messages, text, after, vector = value
        for m in messages:
            self.assertIn("stream", m)
            self.assertIn("second Client", m)
        self.assertEqual(text, whole)
        self.assertIsInstance(after, str)
        self.assertEqual(len(vector), 1)

    def test_a_callback_calling_its_client_is_refused(self):
        # The call whose callback this is holds the client: waiting for its turn would
        # never end. (The library refuses the call too, but only once it is made.)
        self.c.kb_create("threads")
        try:
            [(how, value)] = on_threads(self, [lambda: self.refused(lambda: self.c.kb_add(
                "threads", {"d": "A note."}, progress=lambda p: self.c.embed("x")))], 20)
            self.assertEqual(how, "ok", value)
            self.assertIn("second Client", value)
            # The client takes the next call.
            self.assertEqual(len(self.c.embed("x")), 1)
        finally:
            self.c.kb_drop("threads")

    def test_calls_from_other_threads_wait_for_a_stream(self):
        # Other threads' calls while a thread reads streams take their turns after each
        # stream's call: they met it on the connection, and hung.
        whole = self.c.complete("go on", max_tokens=200, temperature=0)
        want = self.c.complete("one two three", max_tokens=4, temperature=0)

        def streams():
            return ["".join(self.c.complete("go on", stream=True, max_tokens=200,
                                            temperature=0)) for _ in range(10)]

        def calls():
            return [self.c.complete("one two three", max_tokens=4, temperature=0)
                    for _ in range(20)]
        got = on_threads(self, [streams] + [calls] * 4)
        for how, value in got:
            self.assertEqual(how, "ok", value)
        self.assertEqual(got[0][1], [whole] * 10)
        self.assertEqual([v for _, v in got[1:]], [[want] * 20] * 4)

    def test_closing_while_other_threads_call(self):
        # In a fresh interpreter: close() freed the connection under the calls of other
        # threads, which went on reading it (a hang, or SIGSEGV). Their calls now end (a
        # stream's is cancelled) and later ones raise ValueError.
        code = ("import threading, time, llmsclient\n"
                "c = llmsclient.connect(app='pytest')\n"
                "ended = []\n"
                "def calls():\n"
                "    try:\n"
                "        while True:\n"
                "            c.complete('one two three', max_tokens=8)\n"
                "    except ValueError as e:\n"
                "        ended.append(str(e))\n"
                "def stream():\n"
                "    for _ in c.complete('go on', stream=True, max_tokens=450):\n"
                "        time.sleep(0.01)\n"
                "    ended.append('stream')\n"
                "threads = [threading.Thread(target=f) for f in [calls] * 4 + [stream]]\n"
                "for t in threads:\n"
                "    t.start()\n"
                "time.sleep(0.3)\n"
                "c.close()\n"
                "for t in threads:\n"
                "    t.join(30)\n"
                "print(sorted(ended))\n")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60,
                           env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, str(["llmsclient: the client is closed"] * 4 + ["stream"])
                         + "\n")


class KbTest(unittest.TestCase):
    """Knowledge bases and RAG: what the C API does, in Python values."""

    DOCS = {
        "apples": "Notes about the apple orchard harvest. The apple orchard harvest was "
                  "discussed today.",
        "rockets": "Notes about the rocket launch orbit. The rocket launch orbit was "
                   "discussed today.",
        "violins": "Notes about the violin concert music. The violin concert music was "
                   "discussed today.",
    }

    def setUp(self):
        self.c = llmsclient.connect(app="pytest-kb")

    def tearDown(self):
        for kb in self.c.kb_list():
            self.c.kb_drop(kb.name)
        self.c.close()

    def test_create_add_list_search_remove_drop(self):
        self.c.kb_create("notes")
        self.assertEqual(status_of(self, self.c.kb_create, "notes"), "FAILED_PRECONDITION")
        passages = self.c.kb_add("notes", self.DOCS)
        self.assertGreaterEqual(passages, len(self.DOCS))
        self.assertEqual(self.c.kb_add("notes", [("plums", "Plums are purple.", "fruit"),
                                                 ("pears", "Pears are green.")]), 2)
        [info] = self.c.kb_list()
        self.assertIsInstance(info, llmsclient.KbInfo)
        self.assertEqual((info.name, info.documents, info.passages),
                         ("notes", len(self.DOCS) + 2, passages + 2))
        self.assertGreater(info.bytes, 0)
        self.assertGreater(info.passage_tokens, info.overlap_tokens)
        self.assertFalse(info.share_uid)
        self.assertTrue(info.embed_model)  # the default embed model, recorded
        self.assertEqual(status_of(self, self.c.kb_create, "other", embed_model="nope"),
                         "NOT_FOUND")
        self.c.kb_create("shared-notes", share_uid=True)
        self.assertEqual({k.name: k.share_uid for k in self.c.kb_list()},
                         {"notes": False, "shared-notes": True})
        self.c.kb_drop("shared-notes")

        [hit] = self.c.kb_search("notes", "apple orchard harvest", k=1, retrieval="bm25")
        self.assertEqual((hit.document, hit.metadata), ("apples", None))
        self.assertIn("apple orchard", hit.text)
        [plum] = self.c.kb_search("notes", "plums purple", k=1, retrieval="bm25")
        self.assertEqual((plum.document, plum.metadata, plum.text),
                         ("plums", "fruit", "Plums are purple."))

        self.assertEqual(self.c.kb_remove("notes", ["apples", "no-such-doc"]), 1)
        self.assertEqual(self.c.kb_remove("notes", "plums"), 1)
        found = self.c.kb_search("notes", "discussed today", k=10, retrieval="bm25")
        self.assertEqual({h.document for h in found}, {"rockets", "violins"})
        self.assertEqual(self.c.kb_search("notes", "plums", retrieval="bm25"), [])
        self.assertEqual(self.c.kb_list()[0].documents, len(self.DOCS))

        self.c.kb_drop("notes")
        self.assertEqual(self.c.kb_list(), [])
        self.assertEqual(status_of(self, self.c.kb_drop, "notes"), "NOT_FOUND")

    def test_add_progress_and_cancel(self):
        self.c.kb_create("notes")
        reports = []
        passages = self.c.kb_add("notes", self.DOCS, progress=reports.append)
        # the last report comes when every passage is written, before the answer
        self.assertGreaterEqual(len(reports), 1)
        last = reports[-1]
        self.assertIsInstance(last, llmsclient.KbProgress)
        self.assertEqual((last.phase, last.documents, last.documents_written),
                         ("write", len(self.DOCS), len(self.DOCS)))
        self.assertEqual((last.passages, last.passages_embedded, last.passages_written),
                         (passages, passages, passages))
        self.assertEqual(last.bytes_split, last.bytes)
        self.assertEqual(last.bytes, sum(len(t) for t in self.DOCS.values()))
        # a true return cancels: long before it is written, nothing of it is kept
        big = " ".join("word%d" % (i % 997) for i in range(40000))
        seen = []
        self.assertEqual(status_of(self, self.c.kb_add, "notes", {"big": big},
                                   progress=lambda p: seen.append(p) or True), "CANCELLED")
        self.assertEqual(len(seen), 1)
        self.assertNotEqual(seen[0].phase, "write")
        self.assertEqual(self.c.kb_list()[0].documents, len(self.DOCS))

        def boom(p):
            raise KeyError("from the callback")
        with self.assertRaises(KeyError):
            self.c.kb_add("notes", {"small": "A small note."}, progress=boom)

    def test_errors_carry_the_status(self):
        self.assertEqual(status_of(self, self.c.kb_add, "nokb", {"a": "text"}), "NOT_FOUND")
        self.assertEqual(status_of(self, self.c.kb_search, "nokb", "q"), "NOT_FOUND")
        self.assertEqual(status_of(self, self.c.rag, "nokb", "q?"), "NOT_FOUND")
        self.assertEqual(status_of(self, self.c.rag, "nokb", "q?", stream=True), "NOT_FOUND")
        self.assertEqual(status_of(self, self.c.kb_create, "bad name!"), "INVALID_ARGUMENT")
        # Another app's knowledge base is not there for this one.
        with llmsclient.connect(app="pytest-other") as other:
            other.kb_create("theirs")
            self.assertEqual(status_of(self, self.c.kb_drop, "theirs"), "NOT_FOUND")
            other.kb_drop("theirs")
        with self.assertRaises(ValueError):
            self.c.kb_search("nokb", "q", retrieval="best")
        with self.assertRaises(TypeError):
            self.c.rag("nokb", "q?", model="other")

    def test_rag_answers_from_the_kb_and_its_qa_bank(self):
        self.c.kb_create("facts")
        self.c.kb_add("facts", self.DOCS)
        # BM25: only the passages holding all three words, all of document violins.
        first = self.c.rag("facts", "violin concert music", retrieval="bm25", max_tokens=6,
                           temperature=0)
        self.assertIsInstance(first, llmsclient.RagResult)
        self.assertIs(self.c.last_result, first)
        self.assertNotEqual(first.outcome, "qa_hit")
        self.assertTrue(first.passages)
        self.assertTrue(all(isinstance(p, llmsclient.KbHit) and p.document == "violins"
                            for p in first.passages), first.passages)
        self.assertIsInstance(first.text, str)
        self.assertGreater(first.prompt_tokens, 0)
        self.assertLessEqual(first.generated_tokens, 6)
        self.assertIn(first.stop_reason, ("eos", "max_tokens"))
        # The same question again is answered from the QA bank, without generating: the
        # stored answer with its stop reason and length.
        again = self.c.rag("facts", "violin concert music", retrieval="bm25", max_tokens=6,
                           temperature=0)
        self.assertEqual((again.outcome, again.text, again.stop_reason, again.generated_tokens,
                          again.prompt_tokens),
                         ("qa_hit", first.text, first.stop_reason, first.generated_tokens, 0))
        self.assertGreater(again.qa_similarity, 0.9)
        # Streamed past the QA bank, greedy: the same answer piece by piece.
        pieces = list(self.c.rag("facts", "violin concert music", stream=True, no_qa=True,
                                 retrieval="bm25", max_tokens=6, temperature=0))
        self.assertTrue(all(isinstance(p, str) for p in pieces))
        self.assertEqual("".join(pieces), first.text)
        self.assertIsInstance(self.c.last_result, llmsclient.RagResult)
        self.assertNotEqual(self.c.last_result.outcome, "qa_hit")
        self.assertEqual(self.c.last_result.text, first.text)
        self.assertEqual([p.passage for p in self.c.last_result.passages],
                         [p.passage for p in first.passages])
        [info] = self.c.kb_list()
        self.assertGreaterEqual(info.qa_entries, 1)


class GraphTest(unittest.TestCase):
    """Workflow graphs: the built-in templates over a knowledge base, the app's own."""

    QUESTION = {"question": "violin concert music", "kb": "facts"}
    # Tells a story three times over; every run of its node makes 2 tokens at most.
    LOOP = {"inputs": ["seed"], "output": "story", "max_steps": 10,
            "nodes": [{"name": "tell", "kind": "generate", "output": "story",
                       "prompt": "Once upon a time {seed}{story}", "max_tokens": 2}],
            "edges": [{"from": "START", "to": "tell"},
                      {"from": "tell", "to": "END", "when": "runs(tell) >= 3"},
                      {"from": "tell", "to": "tell"}]}

    def setUp(self):
        self.c = llmsclient.connect(app="pytest-graph")
        self.c.kb_create("facts")
        self.c.kb_add("facts", KbTest.DOCS)

    def tearDown(self):
        for g in self.c.graph_list():
            if not g.builtin:
                self.c.graph_delete(g.name)
        self.c.kb_drop("facts")
        self.c.close()

    def test_one_shot_over_a_kb(self):
        templates = {g.name: g for g in self.c.graph_list() if g.builtin}
        self.assertEqual(set(templates), {"one-shot", "hyde", "multistep", "irg", "recomp"})
        one_shot = templates["one-shot"]
        self.assertEqual(sorted(one_shot.inputs), ["kb", "question"])
        events = []
        r = self.c.graph_run("one-shot", self.QUESTION, on_event=events.append,
                             speculate=False, max_tokens=6, temperature=0)
        self.assertIsInstance(r, llmsclient.GraphResult)
        self.assertEqual((r.steps, r.capped, r.speculations), (2, False, 0))
        self.assertEqual([(t.node, t.runs) for t in r.timings], [("retrieve", 1), ("answer", 1)])
        self.assertTrue(0 < r.timings[1].generated_tokens <= 6)
        self.assertEqual((r.state["question"], r.state["kb"]), ("violin concert music", "facts"))
        self.assertIn("violin concert music", r.state["passages"])
        self.assertEqual(r.state[one_shot.output], r.output)
        self.assertEqual([(e.finished, e.node, e.step) for e in events],
                         [(False, "retrieve", 1), (True, "retrieve", 1),
                          (False, "answer", 2), (True, "answer", 2)])
        self.assertEqual((events[-1].output, events[-1].value), (one_shot.output, r.output))
        # Greedy, speculation changes nothing in the answer.
        again = self.c.graph_run("one-shot", self.QUESTION, speculate=True, max_tokens=6,
                                 temperature=0)
        self.assertEqual(again.output, r.output)

    def test_an_event_handler_cancels(self):
        self.assertEqual(status_of(self, self.c.graph_run, "one-shot", self.QUESTION,
                                   on_event=lambda e: e.finished), "CANCELLED")

        class Enough(Exception):
            pass

        def stop(event):
            raise Enough(event.node)
        with self.assertRaises(Enough) as e:
            self.c.graph_run("one-shot", self.QUESTION, on_event=stop)
        self.assertEqual(str(e.exception), "retrieve")
        # The connection goes on.
        self.assertEqual(self.c.graph_run("one-shot", self.QUESTION, max_tokens=1).steps, 2)

    def test_the_apps_own_graph(self):
        self.c.graph_create("loop", self.LOOP)
        [mine] = [g for g in self.c.graph_list() if not g.builtin]
        self.assertEqual(mine, llmsclient.GraphInfo("loop", False, ["seed"], 1, 3, "story", 10))
        r = self.c.graph_run("loop", {"seed": "a fox"}, temperature=0)
        self.assertEqual((r.steps, r.capped, r.output), (3, False, r.state["story"]))
        [tell] = r.timings
        self.assertEqual((tell.node, tell.runs), ("tell", 3))
        self.assertTrue(0 < tell.generated_tokens <= 6, tell)

        self.assertEqual(status_of(self, self.c.graph_create, "loop", self.LOOP),
                         "FAILED_PRECONDITION")
        self.assertEqual(status_of(self, self.c.graph_create, "hyde", self.LOOP),
                         "FAILED_PRECONDITION")
        bad = dict(self.LOOP, nodes=[dict(self.LOOP["nodes"][0], prompt="{nope}")])
        with self.assertRaises(llmsclient.LlmsError) as e:
            self.c.graph_create("bad", bad)
        self.assertEqual(e.exception.status_name, "INVALID_ARGUMENT")
        self.assertIn("node 'tell'", str(e.exception))
        with self.assertRaises(ValueError):
            self.c.graph_create("bad", dict(self.LOOP, nodes=[dict(self.LOOP["nodes"][0],
                                                                   kind="think")]))
        self.assertEqual(status_of(self, self.c.graph_run, "loop", {}), "INVALID_ARGUMENT")
        self.assertEqual(status_of(self, self.c.graph_run, "nope", {"seed": "x"}), "NOT_FOUND")
        self.assertEqual(status_of(self, self.c.graph_run, "one-shot",
                                   {"question": "q", "kb": "missing"}), "NOT_FOUND")
        # Another app has graphs of its own.
        with llmsclient.connect(app="pytest-other") as other:
            self.assertEqual(status_of(self, other.graph_run, "loop", {"seed": "x"}),
                             "NOT_FOUND")

        self.c.graph_delete("loop")
        self.assertTrue(all(g.builtin for g in self.c.graph_list()))
        self.assertEqual(status_of(self, self.c.graph_delete, "loop"), "NOT_FOUND")


class DefaultAppTest(unittest.TestCase):
    """With no app named a client binds to the app every llmsd client shares when given
    none: $LLMS_APP, else "default"."""

    def setUp(self):
        self.saved = os.environ.pop("LLMS_APP", None)

    def tearDown(self):
        if self.saved is not None:
            os.environ["LLMS_APP"] = self.saved
        else:
            os.environ.pop("LLMS_APP", None)

    def test_default_app_and_socket_from_environment(self):
        with llmsclient.connect() as c:
            self.assertEqual(c.app, "default")
            ctx = c.create_context()
        # The daemon bound it to "default" too: another app does not see the context.
        with llmsclient.connect(app="default") as same, llmsclient.Client(app="other") as other:
            self.assertIsInstance(same.context(ctx.id).call("hi", max_tokens=1), str)
            with self.assertRaises(llmsclient.LlmsError) as e:
                other.context(ctx.id).call("hi", max_tokens=1)
            self.assertEqual(e.exception.status_name, "NOT_FOUND")
            same.context(ctx.id).delete()

    def test_a_kb_made_with_llms_is_found_with_no_app(self):
        cli = os.environ.get("LLMS_CLI")
        if not cli or not os.access(cli, os.X_OK):
            self.skipTest("this build's llms is not there (LLMS_CLI)")
        subprocess.run([cli, "kb", "create", "from-cli"], check=True, capture_output=True)
        with llmsclient.connect() as c, llmsclient.connect(app="pytest") as other:
            self.assertIn("from-cli", [kb.name for kb in c.kb_list()])
            self.assertNotIn("from-cli", [kb.name for kb in other.kb_list()])
            self.assertEqual(c.kb_add("from-cli", {"d": "Made by llms, filled by Python."}), 1)
            c.kb_drop("from-cli")

    def test_llms_app_names_the_default(self):
        os.environ["LLMS_APP"] = "py-env"
        with llmsclient.Client() as c:
            self.assertEqual(c.app, "py-env")
            ctx = c.create_context()
        with llmsclient.connect(app="py-env") as same:
            same.context(ctx.id).delete()
        os.environ["LLMS_APP"] = ""
        with llmsclient.Client() as c:
            self.assertEqual(c.app, "default")


class LibrarySearchTest(unittest.TestCase):
    """Where a fresh interpreter finds libllmsclient without $LLMS_CLIENT_LIB (in the
    order the module docstring gives), and what it says when it finds none."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.lib = os.path.abspath(os.environ["LLMS_CLIENT_LIB"])

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def make_checkout(self):
        """A checkout with the client package and a build/ holding this build's library."""
        src = os.path.join(self.tmp, "src")
        os.makedirs(os.path.join(src, "client"))
        shutil.copy(os.path.join(ROOT, "client", "llms.h"), os.path.join(src, "client"))
        shutil.copytree(os.path.join(ROOT, "python"), os.path.join(src, "python"),
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        os.makedirs(os.path.join(src, "build"))
        built = os.path.join(src, "build", "libllmsclient.so")
        os.symlink(self.lib, built)
        return src, built

    def python(self, path, code, **env):
        """Runs code in a fresh interpreter importing llmsclient from path, in an empty
        folder (the current directory must not count); its stdout."""
        e = {k: v for k, v in os.environ.items() if k != "LLMS_CLIENT_LIB"}
        e.update(env)
        cwd = os.path.join(self.tmp, "cwd")
        os.makedirs(cwd, exist_ok=True)
        r = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r)\n%s"
                            % (path, code)], cwd=cwd, env=e, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    LOADED = "import llmsclient; print(llmsclient.library_path())"
    NOT_FOUND = ("import llmsclient\ntry:\n    llmsclient.connect()\n"
                 "except llmsclient.LibraryNotFoundError as e:\n"
                 "    print(isinstance(e, OSError)); print(e)\n")

    def test_a_missing_llms_client_lib_is_named(self):
        missing = os.path.join(self.tmp, "nowhere", "libllmsclient.so")
        out = self.python(os.path.join(ROOT, "python"), self.NOT_FOUND,
                          LLMS_CLIENT_LIB=missing)
        self.assertTrue(out.startswith("True\n"), out)
        self.assertIn("$LLMS_CLIENT_LIB", out)
        self.assertIn(missing + ": not there", out)
        # Set, it is the only place: the build/ of this checkout is not tried.
        self.assertNotIn(os.path.join(ROOT, "build"), out)

    def test_the_build_of_the_checkout_it_sits_in(self):
        src, built = self.make_checkout()
        self.assertEqual(self.python(os.path.join(src, "python"), self.LOADED), built + "\n")

    def test_the_build_of_the_checkout_pip_installed_it_from(self):
        if any(subprocess.run([sys.executable, "-c", "import " + m],
                              capture_output=True).returncode for m in ("setuptools", "pip")):
            self.skipTest("pip or setuptools is not installed for %s" % sys.executable)
        src, built = self.make_checkout()
        site = os.path.join(self.tmp, "site")
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                        "--no-build-isolation", "--no-deps", "--target", site,
                        os.path.join(src, "python")], check=True, env=env, capture_output=True)
        self.assertEqual(self.python(site, self.LOADED), built + "\n")

    def test_none_found_names_every_place_tried(self):
        site = os.path.join(self.tmp, "site")
        shutil.copytree(os.path.join(ROOT, "python", "llmsclient"),
                        os.path.join(site, "llmsclient"))
        out = self.python(site, self.NOT_FOUND)
        if not out:
            self.skipTest("a libllmsclient is installed on this machine")
        self.assertTrue(out.startswith("True\n"), out)
        for tried in [os.path.join(site, "llmsclient", "libllmsclient.so"),
                      "/usr/local/lib/libllmsclient.so.6", "/usr/lib/libllmsclient.so.6",
                      "\n  libllmsclient.so.6: "]:
            self.assertIn(tried, out)
        self.assertIn("LLMS_CLIENT_LIB", out)
        self.assertIn("make install", out)


class LayoutTest(unittest.TestCase):
    """Every ctypes Structure of the module against its C struct, as a C compiler lays it
    out from client/llms.h: a field missed, moved or mistyped makes the library read or
    write memory Python did not give it."""

    maxDiff = None
    C_NAMES = {
        "llms_params": llmsclient._Params, "llms_result": llmsclient._Result,
        "llms_embeddings": llmsclient._Embeddings,
        "llms_rerank_options": llmsclient._RerankOptions,
        "llms_rerank_hit": llmsclient._RerankHit, "llms_rerank_result": llmsclient._RerankResult,
        "llms_kb_doc": llmsclient._KbDoc, "llms_kb_info": llmsclient._KbInfo,
        "llms_kb_options": llmsclient._KbOptions,
        "llms_kb_hit": llmsclient._KbHit, "llms_kb_progress": llmsclient._KbProgress,
        "llms_rag_options": llmsclient._RagOptions,
        "llms_rag_result": llmsclient._RagResult, "llms_graph_node": llmsclient._GraphNode,
        "llms_graph_edge": llmsclient._GraphEdge, "llms_graph_def": llmsclient._GraphDef,
        "llms_graph_info": llmsclient._GraphInfo, "llms_graph_var": llmsclient._GraphVar,
        "llms_graph_event": llmsclient._GraphEvent, "llms_graph_timing": llmsclient._GraphTiming,
        "llms_graph_result": llmsclient._GraphResult,
        "llms_logit_bias": llmsclient._LogitBias,
        "llms_token_logprob": llmsclient._TokenLogprob,
    }

    def test_structures_match_llms_h(self):
        declared = {v for v in vars(llmsclient).values()
                    if isinstance(v, type) and issubclass(v, ctypes.Structure)}
        self.assertEqual(declared, set(self.C_NAMES.values()),
                         "a Structure without its C name here goes unchecked")
        cc = shutil.which("cc")
        if not cc:
            self.skipTest("no C compiler (cc) to lay out client/llms.h")
        body = []
        for c_name, s in sorted(self.C_NAMES.items()):
            body.append('printf("%%s %%zu", "%s", sizeof(%s));' % (c_name, c_name))
            for f, _ in s._fields_:
                body.append('printf(" %s:%%zu:%%zu", offsetof(%s, %s), sizeof(((%s *)0)->%s));'
                            % (f, c_name, f, c_name, f))
            body.append('putchar(10);')
        with tempfile.TemporaryDirectory() as tmp:
            src, exe = os.path.join(tmp, "layout.c"), os.path.join(tmp, "layout")
            with open(src, "w") as f:
                f.write('#include <stddef.h>\n#include <stdio.h>\n#include "client/llms.h"\n'
                        "int main(void)\n{\n%s\nreturn 0;\n}\n" % "\n".join(body))
            subprocess.run([cc, "-I", ROOT, src, "-o", exe], check=True)
            c_layout = subprocess.run([exe], check=True, capture_output=True,
                                      text=True).stdout.splitlines()
        py_layout = ["%s %d" % (c_name, ctypes.sizeof(s)) +
                     "".join(" %s:%d:%d" % (f, getattr(s, f).offset, getattr(s, f).size)
                             for f, _ in s._fields_)
                     for c_name, s in sorted(self.C_NAMES.items())]
        self.assertEqual(py_layout, c_layout)

if __name__ == "__main__":
    unittest.main(verbosity=2)
