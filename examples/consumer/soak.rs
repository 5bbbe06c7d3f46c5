//! The soak's outcomes: a pseudo-random choice per delivery that the consumer acts on and the
//! reliability suite (`tests/reliability/soak.rs`, which includes this file) predicts, so the test
//! knows each job's fate — acknowledged on which attempt, dropped, or dead-lettered at the cap.

use std::time::Duration;

/// The soak queue's cap: the third failed attempt moves the row to its dead letter.
pub(crate) const MAX_ATTEMPTS: u32 = 3;

/// What a delivery of the soak settles with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Ack,
    Retry,
    RetryAfter(Duration),
    Drop,
}

/// The outcome of delivery `attempt` of row `id`: 55 % ack, 20 % retry, 10 % retry after 10 to
/// 60 ms, 15 % drop — the same in every process for the same `seed`.
pub(crate) fn decide(seed: u64, id: i64, attempt: u32) -> Decision {
    let roll = mix(seed ^ mix(id.cast_unsigned()) ^ mix(u64::from(attempt) << 48));
    match roll % 100 {
        0..55 => Decision::Ack,
        55..75 => Decision::Retry,
        75..85 => Decision::RetryAfter(Duration::from_millis(10 + (roll >> 32) % 51)),
        _ => Decision::Drop,
    }
}

/// SplitMix64's finaliser: a well-spread 64-bit hash.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
