from libc.stdint cimport int64_t


cdef struct Tuning:
    # Every constant of the copy engine that a measurement chose, in one place (see
    # _tuning.pyx for what each was chosen by). Read through ``c_tuning()``; changed only
    # through the module's one door, ``tune()``, by probes and tests.
    # -- the pipeline (_copy_engine)
    int target_chunks        # a copy shorter than K slots is cut in about this many chunks
    int64_t min_chunk        # bytes: the smallest pipelined chunk
    int signal_every         # chunks between checks for KeyboardInterrupt and progress calls
    int fill_pieces          # pieces per copy thread of a slot's fill
    int64_t ramp_first       # bytes of an upload's first chunk (0: a whole slot) ...
    int ramp_growth          # ... each next one this many percent of the last, up to a slot,
    int64_t ramp_max         # ... in uploads of K slots or more up to this many bytes
    int64_t nt_max           # uploads from memory up to this many bytes fill their slots with
                             # non-temporal stores; larger ones with memcpy
    int64_t nt_file_max      # uploads from a file up to this many bytes read through the copy
                             # threads' bounce buffers and fill with non-temporal stores
    int64_t read_bounce      # bytes of each copy thread's bounce buffer for those reads
    # -- small copies (_small_copy)
    bint stream_writes       # 4- and 8-byte uploads as stream writes where the driver has them
    bint fence               # small synchronous copies waited for on the fence word
    int64_t fence_spin_ns    # how long the host spins on the fence before it synchronises
    int64_t fence_max        # bytes: synchronous copies up to this size use the fence
    # -- batches (_batch)
    int64_t large_piece      # bytes: pieces this large skip the scratch area
    bint scattered_pipeline  # large pageable pieces to scattered tensors in one pipeline
    int64_t scratch_max      # bytes of scratch area per device, at most
    int64_t near_gap         # gaps of up to this many bytes per piece still count as one range
    # -- measurement equipment (off unless a probe or test turns it on)
    bint trace               # stamp the pipeline's steps into the trace table
    bint chunk_hook          # call the chunk hook after each pipelined chunk


cdef enum:
    # the pipeline's steps, as the trace table names them (_tuning.TRACE_STEPS)
    STEP_BEGIN = 0           # a copy begins (the number: its bytes)
    STEP_SLOTS = 1           # its slots are found (the number: the chunk size)
    STEP_WAITED = 2          # a chunk's slot is free (the number: the chunk's index)
    STEP_FILLED = 3          # the chunk is in its slot (upload) or out of it (download)
    STEP_QUEUED = 4          # the chunk's DMA is queued
    STEP_SYNCED = 5          # the copy's stream is synchronised (the number: chunks)


cdef Tuning* c_tuning() noexcept nogil
cdef void c_mark(int step, int64_t number) noexcept nogil
cdef int c_call_chunk_hook(bint h2d, int64_t chunk) except -1
