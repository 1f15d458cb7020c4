//! The counting allocator, installed as the binary installs it: the budget
//! OOM's `requested` bytes are the size of the allocation that took the
//! heap over the limit.

use taper::memory::{CountingAlloc, HostMemory};

#[global_allocator]
static A: CountingAlloc = CountingAlloc;

#[test]
fn the_allocation_that_crosses_the_limit_is_remembered() {
    let base = HostMemory::current();
    HostMemory::reset_peak();
    HostMemory::set_limit(Some(base + 100_000));
    let under = vec![1u8; 60_000];
    assert_eq!(HostMemory::take_crossing(), None, "still under the limit");
    let over = vec![2u8; 70_000];
    let second = vec![3u8; 5_000];
    assert_eq!(
        HostMemory::take_crossing(),
        Some(70_000),
        "the first one over"
    );
    assert_eq!(HostMemory::take_crossing(), None, "taken");
    drop((under, over, second));
    HostMemory::set_limit(None);
    let big = vec![4u8; 1 << 20];
    assert_eq!(HostMemory::take_crossing(), None, "no limit watched");
    drop(big);
}
