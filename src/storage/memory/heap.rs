//! Heap sizes as the embedded store counts them: what the allocator
//! takes for a request, and what a log member is. A leaf: the algorithms'
//! states (`crate::limit::algorithms`) count their own heap with it.

/// What glibc's malloc takes from the heap for a request of `n` bytes: `n`
/// plus its 8-byte chunk header, rounded up to 16, never under 32.
pub(crate) const fn heap(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let chunk = n.saturating_add(8 + 15) & !15;
    if chunk < 32 { 32 } else { chunk }
}

/// One member of a sliding log: its time and cost, two `u64`s in the
/// log's ring buffer, whose capacity the store grows and shrinks itself
/// (so it is charged, not guessed). Measured as the map node was
/// (`bytes::NODE_BYTES`), a log of a
/// million members took 16.3 bytes each of resident memory against 16.8
/// estimated: the buffer's whole capacity (1,048,576) is charged, touched
/// or not.
pub(crate) const LOG_MEMBER_BYTES: usize = size_of::<(u64, u64)>();
