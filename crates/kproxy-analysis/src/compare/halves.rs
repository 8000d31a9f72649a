//! Node-sized comparisons split in two: the one way verify spreads a per-item pass over both
//! cores.

/// Runs `f` over `items`: as one call when there are fewer than `parallel_from`, else as two
/// calls on the two halves, the second on another thread. The results come back in item order
/// (one or two of them), so joining them gives what one pass gives.
pub(crate) fn in_halves<'t, T: Sync, R: Send>(
    items: &'t [T],
    parallel_from: usize,
    f: impl Fn(&'t [T]) -> R + Sync,
) -> Vec<R> {
    in_range_halves(items.len(), parallel_from, |range| {
        f(items.get(range).unwrap_or_default())
    })
}

/// [`in_halves`] over the positions `0..len` of a collection that is not a slice: `f` gets
/// `0..len`, or `0..len / 2` and (on another thread) `len / 2..len`.
pub(crate) fn in_range_halves<R: Send>(
    len: usize,
    parallel_from: usize,
    f: impl Fn(std::ops::Range<usize>) -> R + Sync,
) -> Vec<R> {
    if len < parallel_from {
        return vec![f(0..len)];
    }
    let mid = len / 2;
    std::thread::scope(|scope| {
        let later = scope.spawn(|| f(mid..len));
        let first = f(0..mid);
        let later = later
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        vec![first, later]
    })
}

#[cfg(test)]
mod tests {
    use super::{in_halves, in_range_halves};

    #[test]
    fn halves_come_back_in_order() {
        let items: Vec<u32> = (0..9).collect();
        assert_eq!(in_halves(&items, 10, <[u32]>::to_vec), vec![items.clone()]);
        assert_eq!(
            in_halves(&items, 2, <[u32]>::to_vec),
            vec![(0..4).collect::<Vec<_>>(), (4..9).collect()]
        );
        assert_eq!(in_range_halves(9, 10, |r| r), vec![0..9]);
        assert_eq!(in_range_halves(9, 2, |r| r), vec![0..4, 4..9]);
        assert_eq!(in_range_halves(0, 0, |r| r), vec![0..0, 0..0]);
    }
}
