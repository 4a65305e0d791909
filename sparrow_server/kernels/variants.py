"""The selection variants (``SELECT_VARIANTS``): how each builds its top-k kernels (``TopKVariant``, the
register tiers), and what each measured; pure data, read by ``topk``'s launchers and the benchmarks. ``topk``
re-exports what is public here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from sparrow_server.kernels import DEFAULT_SELECT_VARIANT, SELECT_VARIANTS

SELECT_ROWS = (512, 2048, 4096)  # candidate counts up to which a row's scores are held in registers
SELECT_TAILS = (256, 512, 1024)  # ``even``: rows of 2048 + TAIL candidates, held as two register blocks
SELECT_FINE = (1024, 512)  # ``fine``: rows of up to 1024, then 1024 + 512 candidates, before the 2048 tier
SELECT_WARPS = 16     # warps of a ``select_and_write`` program
# ``fine_hist64`` runs 2 rows per SM, so on the 132 SMs of an H100 or H200 up to 264 rows in one wave; below that a
# second launch for the short rows buys no SM and costs its launch (call 24's kernel bench at batch 16).
WIDE_FROM_ROWS = 264


@dataclass(frozen=True)
class TopKVariant:
    """How a selection variant's top-k kernel is built: ``tails``, ``even``'s tiers past 2048 (SELECT_TAILS);
    ``fine``, the tiers of SELECT_FINE below 2048; ``bits`` per radix round (2: compares, 8: histogram);
    ``maxnreg``, a register cap. Uncapped (offline sm_90 compile, ``benchmarks/selection_kernel_resources.py``)
    every variant's kernel takes 128 registers (histogram rounds 88), so one 16-warp program fills an SM's
    65,536 and at batch 64 (512 rows on 132 SMs) the rows run four deep. The compare rounds spill 808 bytes of
    stack at a cap of 64, the histogram rounds 40 (64 registers: 2 programs per SM) or 80 (40 registers: 3)."""

    tails: bool = False
    fine: bool = False
    bits: int = 2
    maxnreg: int | None = None
    # Two launches: the rows of up to 1024 + 512 candidates (SELECT_FINE; with ``fine`` only) in a kernel of
    # ``short_warps`` warps that compiles only those tiers, under ``short_maxnreg``; the longer rows as above.
    short_warps: int | None = None
    short_maxnreg: int | None = None
    # the two launches only from this many rows (request x KV head) on; fewer run as one launch of every row
    short_from_rows: int = 0
    # One launch scores and selects (``sparse_decode.score_and_select``): a program per row streams its own
    # landmarks (a pipelined loop), then runs this top-k on the scores it just wrote (still in L1/L2), with every
    # tier in one kernel under ``maxnreg``. Up to ``fused_max_rows`` rows (None: any); more run the split scoring
    # grid and the launches above. Call 25's bench: fused, selection at batch 16 falls 6-10% (one row per SM:
    # no launch between scoring and top-k, no second read of the scores from L2) and at a GQA group of 4 at 48
    # requests 3.7-8%, but past one wave of row programs (2 per SM) at a group of 2 it rises 1.5-15% (batch 40, 64).
    fused: bool = False
    fused_max_rows: int | None = None
    # Histogram rounds (bits 8) stop at the first round whose digit's bucket holds exactly the keys still needed:
    # then every key from the bucket's lower edge up is taken, whatever the lower bits (at 2K random-like scores
    # a bucket of 24 bits holds one key, so the fourth round almost never runs, the third often not).
    # Call 26's bench: selection at batch 16 falls 1.3-2.9 us a layer, at batch 64 3.4-6.7 us (the top-k by 11-22%).
    # (Building the first round's histogram in the fused row loop instead, from the scores in registers, made that
    # loop 1.6-2.6x slower at batch 16: a histogram per tile stalls the stream. Not offered.)
    exit_early: bool = False
    # The histogram rounds and the index write in fewer block-wide steps: a round's suffix counts by one reverse
    # scan (not a sum and a scan) and its digit, exactness and keys above in one packed sum (not three); a
    # block's write ranks by one scan of packed counts (not two). Offline sm_90 SASS (``--tiers``): the block
    # barriers of a tier fall 47 -> 29 (call 26: at one row per SM the top-k is a chain of them). Call 27's bench:
    # the top-k falls 5-14% in every case (12-14% at one row per SM from 32K), selection 2-5%.
    packed: bool = False
    # The histogram rounds as a loop run until a bucket holds exactly the keys still needed (or four rounds): one copy
    # of a round's code, not four unrolled (offline sm_90 SASS of the 2,048 tier: 624 instructions and 9 barriers
    # against 1,048 and 29). Call 31's phase profile of the fused launch (``benchmarks/selection_phase_profile.py``,
    # 33K x 16) timed each unrolled round's histogram at 2.3-2.8 us and its scan at 0.55, however few keys were live
    # (in the third round those sharing the k-th key's top 16 bits); rolled, the rounds after the first cost the same,
    # so the code fetch is not what a round costs. Its benches: selection 0.8 us less to 0.2 more at batch 16, 0.8-2.1
    # less at 34, 3.3-3.9 less at 64 x 17.4K (at 16K 0.3 more to the same).
    rolled: bool = False
    # The rounds after the first by one global atomic a live key into the row's own 256 bins a round
    # (``radix.atomic_histogram``), not Triton's histogram: Triton 3.6 (the GPU hosts' build) lowers ``tl.histogram``
    # to 9 warp ballots and 8 popcounts a key, live or not, then 256 shared atomics a warp, so a round cost what the
    # row's lanes do (call 31's phase profile: 2.3-2.8 us each at 2,061 candidates, the third round as much as the
    # first). Atomics cost what the live keys do: after the first round, those sharing the k-th key's top 8 bits.
    # Call 32's phase profile at 33K x 16: rounds 2 and 3 0.4 + 0.9 and 0.35 + 0.65 us (histogram + scan) against
    # 2.4 + 0.55 each. The first round stays Triton's: every key is live there and crowds the few digits that sign and
    # exponent take, so its atomics queue (by atomics too, its histogram and scan took 4.3 us against 3.9; spread over
    # 4, 8 or 16 copies of its bins, key j's into copy j % n, 4.7-6.9).
    atomic: bool = False
    # With ``atomic``: the first round by a 32-bin histogram of each key's distance in digits below the row's highest
    # key (``radix.top_digits_round``; Triton 3.6 lowers it to 6 ballots and a popcount a key, the 256-bin one to 9 and
    # 8), the 256-bin histogram only where the k-th key lies 31 or more digits below the highest. Call 32's bench at
    # batch 16 (one host): selection 201.2 against ``fused_atomic_narrow``'s 207.4 us summed over six contexts, less in
    # each (32.8 against 33.8 at 33K); call 33 (another host) at batch 34: 67.5 and 70.4 against 69.4 and 72.9 us,
    # beside ``joint_write``, which won the pick.
    top_digits: bool = False
    # With ``packed``: a row of two register blocks (a tier with a tail) ranks both blocks' taken keys before either
    # gathers its page ids from ``req_to_token`` (``radix.write_row_packed``). Block by block, a warp waits a memory
    # latency for its first block's ids before it can store them and reach the second block's scan, where every warp
    # waits for it: two latencies a row. Call 32's phase profile put the write at 2.3 us (33K x 16); call 33's: 2.17
    # jointly against 2.42 (``fused_joint_narrow``, the default since).
    joint_write: bool = False
    # With ``joint_write``, a fused row program's loads ahead of where it waits on them: its plan loads issued together,
    # its reserved pages' ids gathered before the scoring loop and stored after it (call 33's phase profile at 33K x 16:
    # 0.75 us of reserved pages after the scoring), and the write's page ids gathered for every key at or above the
    # k-th's bucket before the ranks are scanned (``radix.write_row_packed``). Programs of their own, one a request,
    # for the landmarks a step completes (the rows' prologue 1.45 -> 0.95 us) made batch 16's launch 10-12 us longer
    # (call 34: 144 programs on 132 SMs, so some SMs held two rows); the row's own program writes its head of them.
    # Call 34's phase profile (33K x 16): reserved pages 0.03 against 0.76 us, the write 1.85 against 2.21, a program
    # 28.9 against 30.5; its benches: 196.6 against 203.1 and 200.7 us summed over batch 16's six contexts (one host's
    # two cards), 1.3-1.5 us less at batch 32 (``fused_hoisted_narrow``, the default since).
    hoisted: bool = False
    # The selection takes SGLang's query as it comes (a slice of the fused QKV output, its tokens a row of QKV
    # apart) and copies each request's heads contiguous for the attention as it reads them (``sparse_decode.
    # copies_query``): each fused row program its group's heads; past the fused rows (batch 34 at 8 KV heads), the
    # split scoring's first program of each request all of them. The backend's ``q.contiguous()``, a copy kernel of
    # its own before the selection (2.2 us and a gap in each sparse layer of call 34's served profile at 32K x 16),
    # is then not launched at any batch.
    copies_query: bool = False
    # The selection's launch stores the step's key and value into the pool (``sparse_decode.stores_kv``) before its
    # landmark update reads the slot back: each fused row program its KV head's, past the fused rows the split
    # scoring's landmark program of each request every head's. The backend then skips SGLang's ``set_kv_buffer``
    # (its ``store_kvcache`` kernel: 1.5 us and a gap in each sparse layer of call 35's profile at 32K x 16) where the
    # pool is a plain token-major one of the key's dtype. Call 35 (one H200, sparse server alone): 32K x 16 +0.94%.
    stores_kv: bool = False
    # Past the fused rows, the scoring by whole pages (``page_scores_whole``): a few programs an SM, each an even share
    # of one request's candidates, read every KV head's landmark of a page together (2 KB contiguous) through a
    # pipelined loop, where the split grid reads a tile of 32 pages a program, each head's 256 B of a page a load of
    # its own, no pipeline (call 48's bench: 16-22% above a read-only pass shaped as this one, 74% at 4B's 48 x 8K).
    scores_whole_pages: bool = False

    def __post_init__(self):
        assert self.short_warps is None or self.fine, "the short rows' launch holds FINE's tiers"
        assert not self.exit_early or self.bits == 8, "the early exit is the histogram rounds'"
        assert not self.packed or self.bits == 8, "the packed steps are the histogram rounds'"
        assert not self.rolled or (self.exit_early and self.packed), "rolled: the packed rounds, to the early exit"
        assert not self.atomic or self.rolled, "the atomic histograms are the rolled rounds'"
        assert not self.top_digits or self.atomic, "top_digits: the first round before the atomic ones"
        assert not self.joint_write or self.packed, "joint_write: the packed write's ranks"
        assert not self.hoisted or self.joint_write, "hoisted: the joint write's gathers ahead of its ranks"

    @property
    def packed_code(self) -> int:
        """The kernels' PACKED: 0 the plain steps; 1 the packed ones; 2 those with the joint write (``joint_write``);
        3 that with its gathers ahead of its ranks (``hoisted``). ``write_code`` is PACKED - 1 where PACKED."""
        return 3 if self.hoisted else 2 if self.joint_write else int(self.packed)

    @property
    def write_code(self) -> int:
        """``radix.write_row_packed``'s JOINT: 0 block by block; 1 both blocks ranked before either gathers
        (``joint_write``); 2 that with the gathers before the ranks (``hoisted``)."""
        return max(self.packed_code - 1, 0)

    @property
    def atomic_code(self) -> int:
        """The kernels' ATOMIC: 0 Triton's histogram every round; 1 the rounds after its first by atomics; 2 those
        after a first round against the top digits (``top_digits``)."""
        return 2 if self.top_digits else int(self.atomic)

    def fuses(self, rows: int) -> bool:
        """Whether ``rows`` rows score and select in one launch."""
        return self.fused and (self.fused_max_rows is None or rows <= self.fused_max_rows)


_NARROW = TopKVariant(tails=True, fine=True, bits=8, maxnreg=64, fused=True, fused_max_rows=WIDE_FROM_ROWS,
                      short_warps=8, short_maxnreg=40, short_from_rows=WIDE_FROM_ROWS)  # fused_hist64_narrow
_PACKED = replace(_NARROW, exit_early=True, packed=True)  # fused_packed_narrow
TOPK_VARIANTS = {"v1": TopKVariant(), "split": TopKVariant(), "even": TopKVariant(tails=True),
                 "hist": TopKVariant(bits=8), "fine": TopKVariant(tails=True, fine=True),
                 "fine_hist": TopKVariant(tails=True, fine=True, bits=8),
                 "fine_hist64": TopKVariant(tails=True, fine=True, bits=8, maxnreg=64),
                 "fine_hist40": TopKVariant(tails=True, fine=True, bits=8, maxnreg=40),
                 "short8_hist40": TopKVariant(tails=True, fine=True, bits=8, maxnreg=64, short_warps=8,
                                              short_maxnreg=40),
                 "short8_hist40_wide": TopKVariant(tails=True, fine=True, bits=8, maxnreg=64, short_warps=8,
                                                   short_maxnreg=40, short_from_rows=WIDE_FROM_ROWS),
                 "fused_hist64": TopKVariant(tails=True, fine=True, bits=8, maxnreg=64, fused=True),
                 "fused_hist64_narrow": _NARROW,
                 "fused_exit_narrow": replace(_NARROW, exit_early=True),
                 "fused_packed_narrow": _PACKED,
                 "fused_rolled_narrow": replace(_PACKED, rolled=True),
                 "fused_atomic_narrow": replace(_PACKED, rolled=True, atomic=True),
                 "fused_topdigits_narrow": replace(_PACKED, rolled=True, atomic=True, top_digits=True),
                 "fused_joint_narrow": replace(_PACKED, rolled=True, atomic=True, top_digits=True, joint_write=True),
                 "fused_hoisted_narrow": replace(_PACKED, rolled=True, atomic=True, top_digits=True, joint_write=True,
                                                 hoisted=True),
                 "fused_qcopy_narrow": replace(_PACKED, rolled=True, atomic=True, top_digits=True, joint_write=True,
                                               hoisted=True, copies_query=True),
                 "fused_kvstore_narrow": replace(_PACKED, rolled=True, atomic=True, top_digits=True, joint_write=True,
                                                 hoisted=True, copies_query=True, stores_kv=True),
                 "fused_pages_narrow": replace(_PACKED, rolled=True, atomic=True, top_digits=True, joint_write=True,
                                               hoisted=True, copies_query=True, stores_kv=True, scores_whole_pages=True)}
assert tuple(TOPK_VARIANTS) == SELECT_VARIANTS
SELECT_CHUNK = 1024   # scores per tile of ``select_and_write`` for longer rows (streamed from L2)
# SELECT_VARIANTS: ``v1``: the gpu_call14 kernels (64 strided score programs; top-k tiers
# 512/2048/4096), whose cost steps up past 2048 candidates (issue 24). ``split``: score programs
# split each row evenly, v1's top-k. ``even``: ``split`` whose top-k tiers step by SELECT_TAILS
# past 2048 (a second register block: fewer lanes than 4096, but its own block-wide reduction per
# round). ``hist``: ``split`` whose register tiers find the k-th key in 4 rounds of a 256-bin
# histogram instead of 16 rounds of 2-bit compares. Offline sm_90 SASS of one tier (instructions
# per thread / barriers): v1 2048 lanes 2472 / 69, 4096 lanes 4096 / 71; even 2048 + 256 lanes
# 3208 / 141; hist 2048 lanes 1336 / 47, 4096 lanes 2256 / 47, plus one shared-memory atomic per
# live key and round (contended if many keys share a digit). ``fine``: ``even`` whose rows of 513 to
# 2048 candidates (8K to 32K context at page 16) take 1024 or 1024 + 512 lanes, not 2048: at batch 64 the
# 512 rows (64 x 8 KV heads) keep every SM busy and top-k costs what its lanes do (H200, 16K x 64: top-k
# 46.3 us, score 44.5, benchmarks/results/speed/call22/kernel_bench/), where at batch 16 (one row per SM)
# a row's 16 rounds set its cost whatever its lanes. ``fine_hist``: ``fine``'s tiers with ``hist``'s 4
# histogram rounds (one shared-memory atomic per live key and round instead of 4 compares per key and
# round over 16 rounds: fewer instructions where the SMs are full); ``fine_hist64`` / ``fine_hist40``: that
# kernel under a register cap (``TopKVariant.maxnreg``), so 2 or 3 rows share an SM. ``short8_hist40``:
# ``fine_hist64`` whose rows of up to 1024 + 512 candidates (rollout A's lengths, up to 24K tokens) run in a launch of
# their own that compiles only those tiers, 8 warps under 40 registers (24 bytes of stack: 6 rows per SM, offline
# sm_90 compile), the longer rows in a second launch as ``fine_hist64`` (each launch's programs for the other's rows
# return at once); ``short8_hist40_wide``: that from WIDE_FROM_ROWS rows on, ``fine_hist64`` below. The same short
# launch at 16 warps (40 registers, or 32 and 8 bytes of stack) was slower than ``fine_hist64`` in every case of
# call 24's bench (``short_hist``, ``short_hist32`` there), so it is not offered. ``fused_hist64``: one launch of
# scoring and top-k (``sparse_decode.score_and_select``), a program per row that streams its row's landmarks
# (at rollout A's batch the split grid's score kernel reads at about copy bandwidth and the top-k then runs
# alone, 44.6 + 29.4 us at 16K x 64 in call 23's bench; fused, a row's top-k runs beside another row's
# streaming on the same SM); ``fused_hist64_narrow``: that up to WIDE_FROM_ROWS rows (one wave of its programs, 2
# per SM), ``short8_hist40_wide``'s two launches past it. ``fused_exit_narrow``: that whose histogram rounds stop
# once a bucket holds exactly the keys still needed (TopKVariant.exit_early), in every launch;
# ``fused_packed_narrow``: that with the rounds and the write in fewer block-wide steps (TopKVariant.packed).
# Its scoring loop with more landmarks in flight (4 stages of 128 pages, or 6 of 64, against sparse_decode's 3 of
# 128) scored no faster in call 28's bench (within 2% from 32K at batch 16 and 34, slower at 16K): at one row per SM
# the read is not set by the tiles in flight. Not offered. Nor is scoring each row in two programs at one row per SM
# or fewer, the second to finish running the top-k (a per-row counter, acquire-release): in call 28's bench at batch
# 16 the scoring fell 3-7% but the selection rose 17-22% (``benchmarks/results/speed/call28/kernel_bench_paired/``).
# Nor is the fused launch at 8 warps under 128 registers (23% fewer top-k instructions a program in offline SASS):
# in call 29's bench at batch 16 (one row per SM, so 8 warps an SM) its top-k fell 0-1.1 us but its scoring rose
# 2.7-3.8 us, selection 9-12% slower; at batch 34 (two rows an SM) both within 0.2 us
# (``benchmarks/results/speed/call29/kernel_bench_w8/``). Nor is a 2,048 + 512 tier for the rows of 2,049-2,304
# candidates: in call 30's bench it tied the 2,048 + 256 one (top-k 16.1-16.2 us at 2,061-2,301 candidates, batch 16;
# selection summed over six contexts 233.1 against 233.0 us). Past 2,048 candidates the top-k's 13.5-17.7 us follow the
# scores and the budget (presumably the histogram rounds before a bucket holds exactly the keys still needed), not the
# tier: at one context a budget of 128, 256 or 512 pages moved it by up to 3.2 us
# (``benchmarks/results/speed/call30/``).
# ``fused_rolled_narrow``: ``fused_packed_narrow`` whose histogram rounds are a loop (TopKVariant.rolled).
# ``fused_atomic_narrow``: that whose rounds after the first count by global atomics (TopKVariant.atomic). Nor are
# every round by atomics, or the first round's atomics spread over 4, 8 or 16 copies of its bins: slower than it in
# every case of call 32's benches (``benchmarks/results/speed/call32/``). ``fused_topdigits_narrow``: that whose first
# round counts each key's distance in digits below the row's highest key (TopKVariant.top_digits);
# ``fused_joint_narrow``: that whose rows of two register blocks rank both before either gathers (.joint_write);
# ``fused_hoisted_narrow``: that whose row program asks for its loads ahead of where it waits on them (.hoisted).
# ``fused_qcopy_narrow``: that which copies the query contiguous for the attention as it reads it, in either launch
# path (.copies_query).
# ``fused_kvstore_narrow``: that which also stores the step's key and value into the pool (.stores_kv).
# Nor is the split top-k past the fused rows as one launch of every tier up to 399 rows (the short rows' launch of
# its own only from 400, ``fused_kvstore_short400``: at 32K x 34 every row is past 1,536 candidates, so that launch
# selects nothing), nor its long rows' launch under 40 registers (3 programs an SM, 396 rows in one wave,
# ``fused_kvstore_long40``; 112 bytes of stack, offline sm_90). Call 40's bench (us of selection, its calls 1 / 3):
# short400 62.2 / 62.1 against 64.7 / 64.2 at 34 x 32K, 67.9 / 68.1 against 70.5 / 70.8 at 40, but 49.5 / 49.9 against
# 48.7 / 49.2 at 48 x 16K (every row short: the one launch's 16 warps under 64 registers run them slower than their own
# launch); served at 32K x 34, three pairs on one host's two cards, both orders: 3527.4 / 3526.8 / 3527.2 against
# 3521.0 / 3522.8 / 3523.4 tok/s (+0.13%). long40's top-k took what the default's did (16.3 against 16.2 us at 34 x
# 32K: two waves of 2 programs an SM were not what it cost), its selection 63.8 against 64.2, 69.9 against 70.8 at 40;
# served 3457.8 against 3471.6 (one card, another host: -0.4%). Their GPU tests passed (code ``d33c86e``,
# ``benchmarks/results/speed/call40/``).
# Nor is one fused launch at 265-396 rows whose first 2 x 264 - rows rows (whole requests) score and select and whose
# later rows, scored first by the split grid, only select (``fused_kvstore_hybrid``, code ``5fef545``): selection
# 60.0 against 64.4 us at 34 x 32K, but 71.2 against 70.1 at 40, 38.5 against 37.1 at 34 x 16K and 49.6 against 48.6
# at 48 x 16K (call 41, 1); served at 32K x 34 in SGLang's graph of 40 (320 rows: 208 fused) 3520.7 against 3519.2 tok/s
# (+0.04%), and in graphs captured at 34 (272 rows: 256 fused), both orders on one host's two cards, 3498.2 / 3491.8
# against 3485.0 / 3466.9 (+0.55%; call 41, 2). Its GPU tests passed and caught its break
# (``benchmarks/results/speed/call41/``).
# Nor is the fused launch past one wave of 2 row programs an SM, up to 396 rows at 3 under 40 registers (144 bytes of
# stack, offline sm_90: benchmarks/results/speed/call39/kernel_wide3/offline/): in call 39's bench its selection took
# 71.9 against the split launches' 65.0 us at 34 x 32K (its scoring alone 55.0 against 45.4) and 74.1 against 70.5
# at 40; served at 32K x 34, sparse decode 3400.2 against 3471.1 tok/s (two cards at once); its GPU tests passed
# (``benchmarks/results/speed/call39/kernel_wide3/``, code ``d263c89``).
# Nor is the scoring past the fused rows streamed (``fused_stream_narrow``, code ``25c2b29``): a fixed grid of 4
# programs an SM (528 on an H200), each an even share of every row's tiles (64 pages of one KV head) through the fused
# row's pipelined loop, in place of the split grid's program per 32 pages of a request across its heads (2,720
# programs at 34 x 32K; 5,120 at 64 x 16K, 3,072 of them idle). Call 47's bench, us of scoring, the split grid against
# it: 45.8 / 45.9 at 34 x 32K, 52.5 / 51.1 at 34 x 36K, 45.0 / 43.1 and 24.6 / 25.6 at 64 x 16K and 8K, 50.8 / 53.4 at
# 40 x 32K, 34.4 / 35.5 at 48 x 16K. Both grids read the landmarks at 2.6-3.3 TB/s: neither the split grid's idle
# programs nor its one tile a program is what bounds it (nor the bytes: float8 scored as fast, call 43). Its GPU tests
# passed and caught both of its breaks (``benchmarks/results/speed/call47/4_stream_scoring/``).
# ``fused_pages_narrow``: ``fused_kvstore_narrow`` whose scoring past the fused rows reads whole pages
# (TopKVariant.scores_whole_pages), the default of models whose GQA group is 4 or more (``default_select_variant``).
# Call 49's bench (``benchmarks/results/speed/call49/``), us of scoring, the split grid against it: at Qwen3-4B's group
# of 4, 21.9 / 15.0 at 48 x 8K and 36.0 / 30.9 at 48 x 16K (served: +1.2% and +3.1% tok/s); at 1.7B's group of 2,
# 45.4 / 49.2 at 34 x 32K, 51.8 / 53.7 at 34 x 36K, 51.0 / 58.2 at 40 x 32K, 24.5 / 28.2 and 44.8 / 49.5 at 64 x 8K
# and 16K, 34.5 / 31.0 at 48 x 16K (served at 32K: -1.0% at 16, -0.3% at 34).
# Nor are rounds whose 256 digits split the live keys' own range [lowest, highest] (a reduction of both a round, a
# shift of ``key - lowest``), so that the first round parts keys of one exponent and two rounds usually end the search:
# in call 31's phase profile the search took 10.7-14.0 us against the fixed digits' three rounds' 7.5-9.9 (batch
# 16, 32K-34.8K), selection 8-15% slower in every case of its bench.
# Nor are the rows of 2,049 to 4,096 candidates offered the 4,096-lane tier (one register block: the 2,048 tier's 29
# block barriers in offline sm_90 SASS against 45 for 2,048 + a tail): in call 31's bench its top-k took 20.2-20.4 us
# at 2,061-2,301 candidates against the 2,048 + 256 tier's 16.2-16.9 (batch 16), and its phase profile put the cost in
# the histograms (3.0-4.0 us a round against 2.3-2.8): they cost what their lanes do, live or not. Nor are a row's
# reserved pages written before its scoring: within 1.0 us either way in every case of that bench
# (``benchmarks/results/speed/call31/``).
# All select ``select_pages``' pages.


def resolve_variant(variant: str | None) -> str:
    """``variant``, or the default for None; an unknown name is a ValueError (scoring and top-k share it)."""
    variant = DEFAULT_SELECT_VARIANT if variant is None else variant
    if variant not in SELECT_VARIANTS:
        raise ValueError(f"selection variant {variant!r}: expected one of {SELECT_VARIANTS}")
    return variant
