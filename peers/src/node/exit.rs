//! The exit node this member uses (`--use-exit-node`): the pin to the member it first
//! matched, the choice, `weft exit accept`, and the offers status lists.

use std::net::Ipv4Addr;
use std::time::Instant;

use tracing::{info, warn};

use crate::address::DEFAULT_ROUTE;
use crate::identity::NodeId;
use crate::node::Node;
use crate::topology::Record;

/// The names `--use-exit-node` lists, in its order of preference (comma-separated).
pub(crate) fn exit_list(wanted: &str) -> Vec<&str> {
    wanted.split(',').map(str::trim).filter(|w| !w.is_empty()).collect()
}

/// Whether `--use-exit-node` names several exits or says `auto`: the exit then moves
/// between them ([`crate::node::routers`]) instead of being pinned to one member.
pub(crate) fn several_exits(wanted: &str) -> bool {
    wanted.eq_ignore_ascii_case("auto") || exit_list(wanted).len() > 1
}

/// Whether a member's record offers it as an exit node.
pub(crate) fn offers_exit(r: &Record) -> bool {
    r.proxied.contains(&DEFAULT_ROUTE)
}

impl Node {
    /// The exit in use: the member `--use-exit-node` was pinned to (the one it first
    /// matched, [`crate::Names`]), while it still matches and offers an exit. Another
    /// member taking the name (or an id with the same first digits) never moves the
    /// exit: that fails closed until `weft exit accept` ([`Node::accept_exit`]).
    pub(crate) fn exit_node(&self) -> Option<&Record> {
        let wanted = self.cfg.use_exit.as_deref()?;
        let grants = |r: &Record| crate::authority::grants(&self.cfg.authorities, r, Ipv4Addr::UNSPECIFIED.into(), 0);
        if several_exits(wanted) {
            let id = self.routers.exit?;
            return self.mesh.topology.get(&id).filter(|r| offers_exit(r) && grants(r));
        }
        let chosen = self.cfg.names.exit_pin(wanted).or_else(|| self.exit_choice())?;
        self.named_exit().find(|r| r.node() == chosen).filter(|r| offers_exit(r) && grants(r))
    }

    /// The member one name of `--use-exit-node`'s list stands for: the member the
    /// name is bound to ([`crate::Names::holder`]), else the lowest node id among
    /// those it matches (a host name, or the first digits of a node id).
    pub(crate) fn exit_choice_for(&self, name: &str) -> Option<NodeId> {
        let bound = self.cfg.names.holder(name);
        let named: Vec<NodeId> = self.records_named(name).map(Record::node).collect();
        named.iter().copied().find(|id| Some(*id) == bound).or_else(|| named.iter().copied().min())
    }

    /// The member `--use-exit-node` would pin now: among those it names, the one its
    /// name is bound to ([`crate::Names::holder`]), else the lowest node id (an id
    /// prefix shared by several).
    pub(crate) fn exit_choice(&self) -> Option<NodeId> {
        let bound = self.cfg.use_exit.as_deref().and_then(|w| self.cfg.names.holder(w));
        let named: Vec<NodeId> = self.named_exit().map(Record::node).collect();
        named.iter().copied().find(|id| Some(*id) == bound).or_else(|| named.iter().copied().min())
    }

    /// Another member `--use-exit-node` names while the pinned one is gone or no
    /// longer matches: the exit does not move to it.
    pub(crate) fn exit_changed(&self) -> Option<&Record> {
        let wanted = self.cfg.use_exit.as_deref()?;
        let pinned = self.cfg.names.exit_pin(wanted)?;
        if self.named_exit().any(|r| r.node() == pinned) {
            return None;
        }
        let other = self.exit_choice()?;
        self.named_exit().find(|r| r.node() == other)
    }

    /// Pins `--use-exit-node` to the member it first matches, and says once when
    /// another member matches instead.
    pub(crate) fn pin_exit(&mut self) {
        let Some(wanted) = self.cfg.use_exit.clone().filter(|w| !several_exits(w)) else { return };
        let Some(pinned) = self.cfg.names.exit_pin(&wanted) else {
            let Some(id) = self.exit_choice() else { return };
            info!(exit = %wanted, node = %id, "--use-exit-node pinned to the member it first matched");
            self.cfg.names.pin_exit(&wanted, id);
            self.actions.push_back(crate::node::Action::SaveNames(self.cfg.names.clone()));
            return;
        };
        if let Some(other) = self.exit_changed().map(Record::node)
            && self.report.exit_warned != Some(other)
        {
            self.report.exit_warned = Some(other);
            warn!(
                exit = %wanted,
                %pinned,
                now = %other,
                "--use-exit-node now matches member {other}, not the member {pinned} it was pinned to: internet \
                 traffic fails closed; `weft exit accept` uses the new member (a node id names an exit \
                 unambiguously)"
            );
        }
    }

    /// `weft exit accept`: pins `--use-exit-node` to the member it matches now.
    pub fn accept_exit(&mut self, now: Instant) -> Result<String, String> {
        let wanted = self.cfg.use_exit.clone().ok_or("this node uses no exit (--use-exit-node)")?;
        if several_exits(&wanted) {
            return Err(format!(
                "--use-exit-node {wanted} is not pinned: it moves between the exits it names (see `weft status`)"
            ));
        }
        if let Some(pinned) = self.cfg.names.exit_pin(&wanted)
            && self.named_exit().any(|r| r.node() == pinned)
        {
            return Ok(format!("--use-exit-node {wanted} already uses member {pinned}"));
        }
        let id = self.exit_choice().ok_or_else(|| format!("no member matches --use-exit-node {wanted}"))?;
        self.cfg.names.pin_exit(&wanted, id);
        self.report.exit_warned = None;
        self.actions.push_back(crate::node::Action::SaveNames(self.cfg.names.clone()));
        self.published.routes_dirty = true;
        self.finish_step(now);
        warn!(exit = %wanted, node = %id, "exit accepted: --use-exit-node now pinned to member {id}");
        Ok(format!("--use-exit-node {wanted} now uses member {id}"))
    }

    /// Other members that `--use-exit-node` names, whether they offer an exit or not.
    pub(crate) fn named_exit(&self) -> impl Iterator<Item = &Record> + '_ {
        self.records_named(self.cfg.use_exit.as_deref().unwrap_or_default())
    }

    /// Other members a name matches: by host name, or by the first (six or more)
    /// digits of the node id.
    fn records_named<'a>(&'a self, wanted: &'a str) -> impl Iterator<Item = &'a Record> + 'a {
        let lower = wanted.to_ascii_lowercase();
        self.mesh.topology.records().filter(move |r| {
            !wanted.is_empty()
                && r.node() != self.id
                && (r.hostname.eq_ignore_ascii_case(wanted)
                    || (lower.len() >= 6 && r.node().to_string().starts_with(&lower)))
        })
    }

    /// Members offering themselves as exits.
    pub(crate) fn exit_offers(&self) -> Vec<(NodeId, String)> {
        self.mesh
            .topology
            .records()
            .filter(|r| r.node() != self.id && offers_exit(r))
            .map(|r| (r.node(), r.hostname.clone()))
            .collect()
    }

    /// The exit in use, for status.
    pub(crate) fn exit_status(&self) -> Option<crate::status::ExitStatus> {
        let wanted = self.cfg.use_exit.clone()?;
        let node = self.exit_node().map(|r| (r.node(), r.hostname.clone()));
        let routing = self.published.installed_subnets.contains(&DEFAULT_ROUTE);
        let several = several_exits(&wanted);
        let candidates = if several { self.exit_candidates() } else { Vec::new() };
        let known = if several { !candidates.is_empty() } else { self.named_exit().next().is_some() };
        let pinned = self.cfg.names.exit_pin(&wanted).filter(|_| !several);
        let changed_to = self.exit_changed().filter(|_| !several).map(|r| (r.node(), r.hostname.clone()));
        let candidates = candidates
            .into_iter()
            .map(|id| (id, self.mesh.topology.get(&id).map(|r| r.hostname.clone()).unwrap_or_default()))
            .collect();
        let failovers = self.routers.failovers;
        Some(crate::status::ExitStatus { wanted, node, routing, known, pinned, changed_to, candidates, failovers })
    }
}
