//! The requests stream split into shards (`[streams] shards = N`), and the one rule every caller
//! follows to pick a request's shard.
//!
//! With N = 1 (the default) the requests stream is the one stream it always was, under its own
//! name. With N > 1 it is N streams, `<requests>:{<tag>}`, each with a hash tag of its own, so a
//! Redis Cluster spreads them over its masters:
//!
//! - **The tag of shard k of N** is the first of the strings `s(0)`, `s(1)`, … whose cluster slot
//!   (CRC16/XMODEM mod 16384) lies in the middle half of the k-th of N equal slices of the slots,
//!   where `s(n)` is n written in bijective base 62 over `0`-`9`, `a`-`z`, `A`-`Z`, least
//!   significant character first (`0`…`Z`, then `00`, `10`, …, `Z0`, `01`, …); the slice: `[lo + w/4, hi - w/4)` with `lo = ⌊k·16384/N⌋`,
//!   `hi = ⌊(k+1)·16384/N⌋`, `w = hi - lo`. A cluster made by `redis-cli --cluster create` gives
//!   each of its M masters an equal slice, so when N is a multiple of M every master holds N/M
//!   shards (`{0}`…`{5}` would put three of six shards on one of three masters).
//! - **The shard of a request** is CRC16/XMODEM of its request id, modulo N, where the request
//!   id is resolved as docs/CONTRACTS.md says (`data.request_id`, else the envelope's `id`); a
//!   `tool.cancel` names the call it cancels in `data.request_id`, so it goes to that call's
//!   shard; `tools.*` requests (discovery, statistics) go to shard 0. A request with neither id
//!   is at home on whichever shard it was added to (its id is then its entry id there).

use crate::slots;

/// The most shards a requests stream may have: every shard's slice then still has a middle half
/// of 8 slots or more.
pub const MAX_SHARDS: u16 = 1024;

/// The shards of one requests stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shards {
    /// The requests stream's bare name (`[streams] requests`).
    base: String,
    /// Their tags, one per shard; empty for one shard.
    tags: Vec<String>,
}

impl Shards {
    /// `count` shards of the requests stream `base` (a bare name); `count` is clamped to
    /// `1..=MAX_SHARDS`.
    pub fn new(base: &str, count: u16) -> Shards {
        let count = count.clamp(1, MAX_SHARDS);
        let tags = if count == 1 { Vec::new() } else { (0..count).map(|k| shard_tag(k, count)).collect() };
        Shards { base: base.to_owned(), tags }
    }

    /// How many shards there are.
    pub fn count(&self) -> u16 {
        u16::try_from(self.tags.len()).unwrap_or(MAX_SHARDS).max(1)
    }

    /// The bare name of shard `k` (taken modulo the count): the base name for one shard,
    /// `<base>:{<tag>}` for more.
    pub fn stream(&self, k: u16) -> String {
        match self.tags.get(usize::from(k % self.count())) {
            Some(tag) => format!("{}:{{{tag}}}", self.base),
            None => self.base.clone(),
        }
    }

    /// Every shard's bare name, in order.
    pub fn streams(&self) -> Vec<String> {
        (0..self.count()).map(|k| self.stream(k)).collect()
    }

    /// The shard whose bare name is `stream`, if it is one of these.
    pub fn index_of(&self, stream: &str) -> Option<u16> {
        (0..self.count()).find(|k| self.stream(*k) == stream)
    }

    /// The shard of a request of type `event_type` with request id `request_id` (see the module
    /// documentation): `None` when it has no id of its own (it is at home anywhere).
    pub fn of_request(&self, event_type: &str, request_id: Option<&str>) -> Option<u16> {
        if event_type.starts_with("tools.") {
            return Some(0);
        }
        request_id.map(|id| self.of_id(id))
    }

    /// The shard of request id `id`: CRC16/XMODEM of its bytes, modulo the count.
    pub fn of_id(&self, id: &str) -> u16 {
        slots::crc16(id.as_bytes()) % self.count()
    }
}

/// The tag of shard `k` of `count` (see the module documentation).
fn shard_tag(k: u16, count: u16) -> String {
    let (k, count) = (u32::from(k), u32::from(count));
    let slots = u32::from(slots::SLOTS);
    let (lo, hi) = (k * slots / count, (k + 1) * slots / count);
    let quarter = (hi - lo) / 4;
    let (from, to) = (lo + quarter, hi - quarter);
    slots::candidates()
        .find(|candidate| (from..to).contains(&u32::from(slots::slot(candidate.as_bytes()))))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slot ranges `redis-cli --cluster create` gives `masters` masters.
    fn default_ranges(masters: u32) -> Vec<(u32, u32)> {
        let per = 16384.0 / f64::from(masters);
        (0..masters)
            .map(|i| {
                let first = (f64::from(i) * per).round() as u32;
                let last = (f64::from(i + 1) * per).round() as u32 - 1;
                (first, last)
            })
            .collect()
    }

    #[test]
    fn shards_spread_evenly_over_a_default_clusters_masters() {
        for masters in [1_u32, 2, 3, 4, 5, 6, 8, 12, 16, 32] {
            for per in 1..=4_u32 {
                let count = masters * per;
                let shards = Shards::new("action-requests", count as u16);
                let mut held = vec![0_u32; masters as usize];
                for stream in shards.streams() {
                    let at = u32::from(slots::slot(stream.as_bytes()));
                    let master = default_ranges(masters)
                        .iter()
                        .position(|(first, last)| (*first..=*last).contains(&at))
                        .unwrap();
                    held[master] += 1;
                }
                assert!(held.iter().all(|n| *n == per), "{count} shards on {masters} masters: {held:?}");
            }
        }
    }

    #[test]
    fn the_documented_tags_and_the_shard_rule() {
        let six = Shards::new("action-requests", 6);
        let streams = six.streams();
        // The table in docs/CONTRACTS.md, "Sharded requests streams" (and the Python client's
        // test of the same rule).
        let tags = |count: u16| -> Vec<String> {
            Shards::new("action-requests", count)
                .streams()
                .iter()
                .map(|stream| stream.trim_start_matches("action-requests:{").trim_end_matches('}').to_owned())
                .collect()
        };
        assert_eq!(tags(2), ["2", "0"]);
        assert_eq!(tags(3), ["3", "c", "0"]);
        assert_eq!(tags(4), ["3", "2", "1", "0"]);
        assert_eq!(tags(6), ["3", "j", "c", "1", "h", "a"]);
        assert_eq!(tags(8), ["e0", "b", "20", "c", "g0", "d", "00", "a"]);
        assert_eq!(streams[0], "action-requests:{3}");
        let slots: Vec<u16> = streams.iter().map(|stream| slots::slot(stream.as_bytes())).collect();
        for (k, slot) in slots.iter().enumerate() {
            let (lo, hi) = (k as u32 * 16384 / 6, (k as u32 + 1) * 16384 / 6);
            assert!((lo..hi).contains(&u32::from(*slot)), "shard {k}: {slot}");
        }
        assert_eq!(Shards::new("action-requests", 1).streams(), ["action-requests"]);
        assert_eq!(six.index_of(&streams[4]), Some(4));
        assert_eq!(six.index_of("action-requests"), None);
        // CRC16/XMODEM("123456789") = 0x31C3 = 12739; 12739 mod 6 = 1.
        assert_eq!(six.of_id("123456789"), 1);
        assert_eq!(six.of_request("tools.discover", Some("123456789")), Some(0));
        assert_eq!(six.of_request("tool.cancel", Some("123456789")), Some(1));
        assert_eq!(six.of_request("echo.requested", None), None);
        assert_eq!(Shards::new("x", 0).count(), 1);
        assert_eq!(Shards::new("x", 5000).count(), MAX_SHARDS);
    }
}
