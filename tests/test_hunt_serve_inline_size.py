"""A sub-millisecond model runs on the server's event loop, its call time measured on its warm-up sample
(an 8x8 BMP for digits). A request whose item is far larger (a 6000x6000 JPEG: 211 ms of decoding on the
2-core EPYC) ran on the loop too, holding every other request for the whole decode, and then cost the model
the loop (a stall demotion). Now an item larger than INLINE_MAX_ITEM_BYTES and 4x the sample goes to the
pool: the model stays inline for the small requests it was timed on."""

from __future__ import annotations

import asyncio
import io
import threading

from PIL import Image

from edge_runtime.serve_inline import INLINE_MAX_ITEM_BYTES, INLINE_MAX_MS, Inline
from test_serve_inline import HELD_OUT, _req, _spy


def test_admits_counts_the_largest_items_size_against_the_sample():
    inl = Inline(INLINE_MAX_MS / 4, sample_bytes=100)
    assert inl.max_item_bytes == INLINE_MAX_ITEM_BYTES                  # the floor over a tiny sample
    assert inl.admits(1, INLINE_MAX_ITEM_BYTES) and not inl.admits(1, INLINE_MAX_ITEM_BYTES + 1)
    big = Inline(INLINE_MAX_MS / 4, sample_bytes=INLINE_MAX_ITEM_BYTES)
    assert big.admits(1, 4 * INLINE_MAX_ITEM_BYTES) and not big.admits(1, 4 * INLINE_MAX_ITEM_BYTES + 1)
    assert not inl.admits(5, 0)                                          # the item count still bounds it


def test_a_large_image_goes_to_the_pool_and_the_model_stays_inline(digits_artifact):
    from edge_runtime.serve_core import ServeCore

    small = sorted(HELD_OUT.rglob("*.png"))[0].read_bytes()
    buf = io.BytesIO()
    Image.new("L", (2000, 2000), 128).save(buf, "JPEG", quality=95)
    large = buf.getvalue()
    assert len(large) > INLINE_MAX_ITEM_BYTES
    core = ServeCore([digits_artifact])
    try:
        core.load_all()
        (m,) = core.models.values()
        assert m.inline is not None and m.inline.on
        seen, _ = _spy(m)
        loop = []

        async def main():
            loop.append(threading.current_thread().name)
            return [await core.infer(_req(x)) for x in (small, large, small)]

        got = asyncio.run(main())
        assert len(got) == 3 and all(r.outputs[0].data for r in got)
        assert seen[0] == loop[0] and seen[2] == loop[0], seen               # the small ones: the loop
        assert seen[1].startswith("edge-serve"), seen                        # the large one: the pool
        assert m.inline.on and m.inline.demotions == 0 and m.inline.calls == 2
    finally:
        core.close()
