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
    if items.len() < parallel_from {
        return vec![f(items)];
    }
    let (first, second) = items.split_at(items.len() / 2);
    std::thread::scope(|scope| {
        let later = scope.spawn(|| f(second));
        let first = f(first);
        let later = later
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        vec![first, later]
    })
}

#[cfg(test)]
mod tests {
    use super::in_halves;

    #[test]
    fn halves_come_back_in_order() {
        let items: Vec<u32> = (0..9).collect();
        assert_eq!(in_halves(&items, 10, <[u32]>::to_vec), vec![items.clone()]);
        assert_eq!(
            in_halves(&items, 2, <[u32]>::to_vec),
            vec![(0..4).collect::<Vec<_>>(), (4..9).collect()]
        );
    }
}
