//! Several members for one job: the routers of a subnet (members whose certificates
//! grant it and that proxy it) and the exits `--use-exit-node` lists or finds
//! (`auto`). Every node picks the same primary router (highest `--router-priority`,
//! then the lowest node id) and the first exit of its list; it watches those it uses
//! with a ping every [`WATCH_EVERY`], moves to the next one when the current one is
//! lost (no session, or nothing heard for [`WATCH_DEAD`]) and back to a preferred one
//! only after it has stayed reachable for [`RETURN_HOLD`], so that a router coming
//! and going does not flap the routes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::identity::NodeId;
use crate::node::Node;
use crate::node::exit::offers_exit;
use crate::peer::Peer;
use crate::status::{RouterState, RouterStatus, SubnetStatus};
use crate::timing::{ACTIVE_WINDOW, WANTED_FOR, ms_since};
use crate::topology::Record;

/// A router or exit in use is pinged this often.
pub(crate) const WATCH_EVERY: Duration = Duration::from_millis(250);
/// A watched router or exit from which nothing arrived for this long is lost (four
/// pings and a little: one lost ping or a slow answer does not move the routes).
pub(crate) const WATCH_DEAD: Duration = Duration::from_millis(1100);
/// A preferred router or exit that came back is used again once it has been
/// reachable this long.
pub(crate) const RETURN_HOLD: Duration = Duration::from_secs(3);
/// Most routers of one subnet (or exits) watched at once.
const MAX_WATCHED: usize = 4;
/// A subnet none of whose routers could carry traffic (or an exit list with none
/// usable) is looked at again this often: a router can become usable again (its
/// session back) without the routes changing.
const UNSETTLED_CHECK: Duration = Duration::from_secs(1);

/// What the engine chose among several routers and exits, and since when each
/// candidate has been reachable.
#[derive(Debug, Default)]
pub(crate) struct Routers {
    /// The primary router of each subnet that has more than one.
    pub(crate) primary: BTreeMap<(IpAddr, u8), (NodeId, &'static str)>,
    /// The exit in use when `--use-exit-node` lists several or says `auto`.
    pub(crate) exit: Option<NodeId>,
    /// Candidates reachable without a break since then.
    reachable_since: BTreeMap<NodeId, Instant>,
    /// Members pinged as routers or exits in use.
    pub(crate) watched: BTreeSet<NodeId>,
    /// When the choice must be looked at again (a watched member's silence would
    /// pass [`WATCH_DEAD`], a preferred one's hold ends).
    pub(crate) check_at: Option<Instant>,
    /// Moves to another router or exit because the one in use was lost.
    pub(crate) failovers: u64,
    /// Moves back to a preferred one that returned.
    pub(crate) failbacks: u64,
}

/// The preference order of a subnet's routers: highest priority, then lowest id.
fn preference(r: &Record) -> (std::cmp::Reverse<u8>, NodeId) {
    (std::cmp::Reverse(r.priority), r.node())
}

/// An exit `auto` uses keeps its place ahead of others unless they are nearer by
/// more than this many milliseconds or a quarter of its latency, whichever is more:
/// two exits at about the same distance do not take turns as their latencies jitter.
const AUTO_MARGIN_MS: u32 = 10;

/// `auto`'s order of preference among `(exit, latency ms, hops)`: nearest first, then
/// fewest hops, then lowest id, with the exit in use (`current`) favoured by
/// [`AUTO_MARGIN_MS`].
fn nearest_first(mut offers: Vec<(NodeId, u32, u32)>, current: Option<NodeId>) -> Vec<NodeId> {
    offers.sort_by_key(|&(id, latency, hops)| {
        let latency =
            if Some(id) == current { latency.saturating_sub(AUTO_MARGIN_MS.max(latency / 4)) } else { latency };
        (latency, hops, id)
    });
    offers.into_iter().map(|(id, _, _)| id).collect()
}

impl Node {
    /// Whether member `id` can carry traffic now, and if not why: its session is up
    /// and (when watched) it answered lately, or it has no session but is reachable
    /// and was never lost (its first packet starts one).
    fn candidate_state(&self, id: NodeId, now: Instant) -> Result<(), &'static str> {
        let Some(p) = self.peer_by_id(id) else {
            return if self.mesh.paths.contains_key(&id) { Ok(()) } else { Err("unreachable") };
        };
        if p.is_up() {
            return if self.routers.watched.contains(&id) && self.quiet(p, now) >= WATCH_DEAD {
                Err("stopped answering")
            } else {
                Ok(())
            };
        }
        if p.down_since.is_some() || p.backoff.in_flight.is_some() && p.error.is_some() {
            return Err("no session");
        }
        if self.mesh.paths.contains_key(&id) { Ok(()) } else { Err("unreachable") }
    }

    /// How long nothing arrived from a watched member (counted from when its watch
    /// began, so that starting to watch an idle session does not find it lost).
    fn quiet(&self, p: &Peer, now: Instant) -> Duration {
        let epoch = self.cfg.epoch;
        let last_ms = p.last_rx_ms().max(p.watch_since.map_or(0, |t| ms_since(epoch, t)));
        now.saturating_duration_since(epoch + Duration::from_millis(last_ms.saturating_sub(1)))
    }

    /// Picks among `candidates` (in preference order): keeps `current` while it can
    /// carry traffic unless a preferred one has been reachable for [`RETURN_HOLD`];
    /// otherwise the first that can. Returns the choice and why.
    fn choose(
        &mut self,
        now: Instant,
        candidates: &[NodeId],
        current: Option<NodeId>,
        what: &str,
    ) -> Option<(NodeId, &'static str)> {
        let ok: Vec<NodeId> = candidates.iter().copied().filter(|id| self.candidate_state(*id, now).is_ok()).collect();
        let best = ok.first().copied();
        let held = |id: NodeId| self.routers.reachable_since.get(&id).is_some_and(|t| now >= *t + RETURN_HOLD);
        match current {
            Some(cur) if ok.contains(&cur) => {
                let preferred = ok.iter().copied().take_while(|id| *id != cur).find(|id| held(*id));
                match preferred {
                    Some(back) => {
                        self.routers.failbacks += 1;
                        info!(%what, from = %cur, to = %back, "a preferred member is back: routed through it again");
                        Some((back, "preferred, reachable"))
                    }
                    None if best == Some(cur) => Some((cur, "preferred, reachable")),
                    None => Some((cur, "in use; a preferred one is not back for long enough")),
                }
            }
            Some(cur) => {
                let why = self.candidate_state(cur, now).err().unwrap_or("gone");
                match best {
                    Some(next) => {
                        self.routers.failovers += 1;
                        warn!(%what, from = %cur, to = %next, "{why}: moved to the next member");
                        Some((next, "the one before it was lost"))
                    }
                    None => None,
                }
            }
            None => best.map(|b| {
                (
                    b,
                    if Some(b) == candidates.first().copied() {
                        "preferred, reachable"
                    } else {
                        "the preferred one is not reachable"
                    },
                )
            }),
        }
    }

    /// Looks at every subnet with several routers and at the exits again: picks each
    /// one's primary, watches those in use, and marks the routes dirty when a choice
    /// moved. Runs when the routes change and when [`Routers::check_at`] passes.
    pub(crate) fn update_routers(&mut self, now: Instant) {
        // Subnets with several routers, candidates in preference order.
        let subnets: Vec<((IpAddr, u8), Vec<NodeId>)> = self
            .routers_by_subnet()
            .into_iter()
            .filter(|(_, rs)| rs.len() > 1)
            .map(|(k, rs)| (k, rs.iter().map(|r| r.node()).collect()))
            .collect();
        let exits = self.exit_candidates();
        // Who is reachable, and since when.
        let everyone: BTreeSet<NodeId> =
            subnets.iter().flat_map(|(_, c)| c.iter().copied()).chain(exits.iter().copied()).collect();
        let reachable: Vec<(NodeId, bool)> =
            everyone.iter().map(|id| (*id, self.candidate_state(*id, now).is_ok())).collect();
        self.routers.reachable_since.retain(|id, _| everyone.contains(id));
        for (id, ok) in reachable {
            if ok {
                self.routers.reachable_since.entry(id).or_insert(now);
            } else {
                self.routers.reachable_since.remove(&id);
            }
        }
        let mut changed = false;
        let mut primary = BTreeMap::new();
        let mut watch: BTreeSet<NodeId> = BTreeSet::new();
        for (prefix, candidates) in &subnets {
            let current = self.routers.primary.get(prefix).map(|(id, _)| *id);
            let what = format!("router of {}/{}", prefix.0, prefix.1);
            let choice = self.choose(now, candidates, current, &what);
            changed |= choice.map(|c| c.0) != current;
            if let Some(c) = choice {
                primary.insert(*prefix, c);
            }
            if self.in_use(candidates, now) {
                watch.extend(candidates.iter().take(MAX_WATCHED));
            }
        }
        self.routers.primary = primary;
        if !exits.is_empty() || self.routers.exit.is_some() {
            let current = self.routers.exit;
            let choice = self.choose(now, &exits, current, "exit").map(|c| c.0);
            changed |= choice != current;
            self.routers.exit = choice;
            if choice.is_some() {
                watch.extend(exits.iter().take(MAX_WATCHED));
            }
        }
        // Start and stop watching; keep handshaking with watched members that lost
        // their session (a preferred router coming back is found without waiting for
        // traffic).
        for id in self.routers.watched.difference(&watch).copied().collect::<Vec<_>>() {
            if let Some(k) = self.peer_by_id(id).map(|p| p.key)
                && let Some(p) = self.peers.get_mut(&k)
            {
                p.watch_since = None;
            }
        }
        let mut check_at: Option<Instant> = None;
        for id in &watch {
            let Some(key) = self.peer_by_id(*id).map(|p| p.key) else { continue };
            let quiet = self.peers.get(&key).map(|p| self.quiet(p, now));
            let Some(p) = self.peers.get_mut(&key) else { continue };
            if p.watch_since.is_none() {
                p.watch_since = Some(now);
                p.probe.next = Some(now);
            }
            if p.is_up() {
                let left = WATCH_DEAD.saturating_sub(quiet.unwrap_or_default());
                if !left.is_zero() {
                    check_at = Some(check_at.map_or(now + left, |c| c.min(now + left)));
                }
            } else {
                p.wanted_until = Some(now + WANTED_FOR);
            }
            self.touch(key);
        }
        // A preferred candidate's hold ends.
        for (id, since) in &self.routers.reachable_since {
            let end = *since + RETURN_HOLD;
            if end > now && watch.contains(id) {
                check_at = Some(check_at.map_or(end, |c| c.min(end)));
            }
        }
        let unsettled = subnets.iter().any(|(prefix, _)| !self.routers.primary.contains_key(prefix))
            || (!exits.is_empty() && self.routers.exit.is_none());
        if unsettled {
            let at = now + UNSETTLED_CHECK;
            check_at = Some(check_at.map_or(at, |c| c.min(at)));
        }
        self.routers.watched = watch;
        self.routers.check_at = check_at;
        if changed {
            self.published.routes_dirty = true;
        }
    }

    /// Every subnet other members proxy (not an exit's /0) with the routers this node
    /// accepts for it, in preference order.
    fn routers_by_subnet(&self) -> BTreeMap<(IpAddr, u8), Vec<&Record>> {
        let claims = self.claimants();
        let mut by_subnet: BTreeMap<(IpAddr, u8), Vec<&Record>> = BTreeMap::new();
        for (r, a, p) in self.accepted_subnets(&claims) {
            if p != 0 {
                by_subnet.entry((a, p)).or_default().push(r);
            }
        }
        for rs in by_subnet.values_mut() {
            rs.sort_by_key(|r| preference(r));
        }
        by_subnet
    }

    /// Whether traffic flowed lately with any of a subnet's routers.
    fn in_use(&self, candidates: &[NodeId], now: Instant) -> bool {
        candidates
            .iter()
            .filter_map(|id| self.peer_by_id(*id))
            .any(|p| p.activity.active(now, ACTIVE_WINDOW) || p.wanted_until.is_some_and(|w| now < w))
    }

    /// Whether the route snapshot sends subnet `a/p` to member `id`: its only router,
    /// or the primary of several.
    pub(crate) fn routes_subnet_via(&self, a: IpAddr, p: u8, id: NodeId) -> bool {
        self.routers.primary.get(&(a, p)).is_none_or(|(primary, _)| *primary == id)
    }

    /// Each subnet with its routers, for status: the primary and why, the others
    /// standing by or lost and why.
    pub(crate) fn subnet_status(&self, now: Instant) -> Vec<SubnetStatus> {
        self.routers_by_subnet()
            .into_iter()
            .map(|((a, p), rs)| {
                let primary = self.routers.primary.get(&(a, p)).copied();
                let routers = rs
                    .iter()
                    .map(|r| {
                        let id = r.node();
                        let (state, why) = match (primary, self.candidate_state(id, now)) {
                            (Some((p, why)), _) if p == id => (RouterState::Primary, why.to_owned()),
                            (None, Ok(())) if rs.len() == 1 => (RouterState::Primary, "the only router".to_owned()),
                            (_, Ok(())) => (RouterState::Standby, "reachable".to_owned()),
                            (_, Err(why)) => (RouterState::Down, why.to_owned()),
                        };
                        RouterStatus { node: id, hostname: r.hostname.clone(), priority: r.priority, state, why }
                    })
                    .collect();
                SubnetStatus { prefix: (a, p), routers }
            })
            .collect()
    }

    /// The exits `--use-exit-node` may use, in its order of preference: each member
    /// its list names (as [`Node::exit_choice_for`] resolves the name), or for `auto`
    /// every member offering an exit it is granted, nearest first. Empty for a
    /// single name (pinned, as before: [`Node::exit_node`]).
    pub(crate) fn exit_candidates(&self) -> Vec<NodeId> {
        let Some(wanted) = self.cfg.use_exit.as_deref() else { return Vec::new() };
        let offering = |id: NodeId| {
            self.mesh.topology.get(&id).is_some_and(|r| {
                offers_exit(r)
                    && crate::authority::grants(&self.cfg.authorities, r, std::net::Ipv4Addr::UNSPECIFIED.into(), 0)
            })
        };
        if wanted.eq_ignore_ascii_case("auto") {
            let offers: Vec<(NodeId, u32, u32)> = self
                .exit_offers()
                .into_iter()
                .map(|(id, _)| id)
                .filter(|id| offering(*id))
                .map(|id| {
                    let path = self.mesh.paths.get(&id);
                    (id, path.map_or(u32::MAX, |p| p.latency_ms), path.map_or(u32::MAX, |p| p.hops))
                })
                .collect();
            return nearest_first(offers, self.routers.exit);
        }
        let names = crate::node::exit::exit_list(wanted);
        if names.len() < 2 {
            return Vec::new();
        }
        let mut v: Vec<NodeId> = Vec::new();
        for name in names {
            if let Some(id) = self.exit_choice_for(name).filter(|id| offering(*id))
                && !v.contains(&id)
            {
                v.push(id);
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(b: u8) -> NodeId {
        NodeId::from_bytes([b; 8])
    }

    #[test]
    fn auto_takes_the_nearest_exit_and_keeps_it_against_jitter() {
        let (a, b, c) = (id(1), id(2), id(3));
        // Nearest first, then fewest hops, then the lowest id; no path last.
        assert_eq!(nearest_first(vec![(a, 40, 1), (b, 12, 2), (c, 12, 1)], None), vec![c, b, a]);
        assert_eq!(nearest_first(vec![(b, u32::MAX, u32::MAX), (a, 90, 3)], None), vec![a, b]);
        // The exit in use stays first while another is only a little nearer ...
        assert_eq!(nearest_first(vec![(a, 20, 1), (b, 14, 1)], Some(a)), vec![a, b]);
        assert_eq!(nearest_first(vec![(a, 200, 1), (b, 160, 1)], Some(a)), vec![a, b]);
        // ... and gives way to one clearly nearer.
        assert_eq!(nearest_first(vec![(a, 20, 1), (b, 5, 1)], Some(a)), vec![b, a]);
        assert_eq!(nearest_first(vec![(a, 200, 1), (b, 140, 1)], Some(a)), vec![b, a]);
        // Without a choice yet, the same jitter decides plainly.
        assert_eq!(nearest_first(vec![(a, 20, 1), (b, 14, 1)], None), vec![b, a]);
    }

    fn router(seed: u8, priority: u8) -> Record {
        let key = weft_core::handshake::StaticKey::from_seed([seed; 32]).public;
        Record {
            proxied: vec![(std::net::Ipv4Addr::new(192, 168, 1, 0).into(), 24)],
            priority,
            ..Record::blank(key, &format!("r{seed}"), std::net::Ipv4Addr::new(10, 0, 0, seed))
        }
    }

    #[test]
    fn routers_are_preferred_by_priority_then_by_the_lowest_node_id() {
        // Every node sorts a subnet's routers the same way, whatever order their
        // records arrived in: the same primary everywhere.
        let rs = [router(9, 100), router(7, 200), router(3, 100), router(5, 0)];
        let order = |mut v: Vec<&Record>| {
            v.sort_by_key(|r| preference(r));
            v.into_iter().map(Record::node).collect::<Vec<_>>()
        };
        let forward = order(rs.iter().collect());
        assert_eq!(forward, order(rs.iter().rev().collect()));
        // The highest priority first; equal priorities by the lowest node id.
        let (n9, n3) = (rs[0].node(), rs[2].node());
        assert_eq!(forward, vec![rs[1].node(), n9.min(n3), n9.max(n3), rs[3].node()]);
    }
}
