//! Who may do what on the control socket. The socket itself (mode 0660, group
//! `weft` under systemd) decides who may connect; connecting is enough to read the
//! status. A request that changes the node needs more: the client's uid is 0, or
//! its primary or a supplementary group is the admin group ([`ADMIN_GROUP`] by
//! default, `--admin-group`). The kernel tells us the client's uid, gid and pid
//! (SO_PEERCRED); its supplementary groups come from `/proc/<pid>/status`. Anything
//! we cannot establish counts as "not an admin" (fail closed).

use std::path::Path;

/// The default admin group: members may add and remove peers.
pub const ADMIN_GROUP: &str = "weft-admin";

/// What a refused client is told.
pub fn refusal(admin_group: &str) -> String {
    format!("changing the node needs root or the {admin_group} group")
}

/// The credentials of a control client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    /// Its user id.
    pub uid: u32,
    /// Its primary group id.
    pub gid: u32,
    /// Its supplementary groups (empty when they could not be read).
    pub groups: Vec<u32>,
}

impl Client {
    /// Whether this client may change the node, given the admin group's id (None when
    /// the group does not exist: then only root may).
    pub fn may_change(&self, admin_gid: Option<u32>) -> bool {
        // The user running an unprivileged node (--no-tun) owns it.
        self.uid == 0 || self.uid == own_uid() || admin_gid.is_some_and(|g| self.gid == g || self.groups.contains(&g))
    }
}

/// The uid this process runs as (the owner of `/proc/self`).
pub fn own_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    own_uid() == 0
}

/// The id of group `name` in a group file (`/etc/group` format), if listed.
pub fn group_id_in(group_file: &str, name: &str) -> Option<u32> {
    group_file.lines().find_map(|line| {
        let mut f = line.split(':');
        let n = f.next()?;
        let _password = f.next()?;
        let gid = f.next()?;
        (n == name).then(|| gid.trim().parse().ok()).flatten()
    })
}

/// The id of group `name` from `/etc/group` (groups only a directory service knows
/// are not found: then only root may change the node).
pub fn group_id(name: &str) -> Option<u32> {
    group_id_in(&std::fs::read_to_string("/etc/group").ok()?, name)
}

/// The supplementary groups on the `Groups:` line of a `/proc/<pid>/status` text,
/// provided its effective uid and gid (second field of `Uid:` and `Gid:`) are `uid`
/// and `gid`: the credentials the kernel gave for the connection. A process that
/// exited and whose pid now names another process of another user yields None.
pub fn groups_in_status(status: &str, uid: u32, gid: u32) -> Option<Vec<u32>> {
    let field = |name: &str| -> Option<Vec<u32>> {
        let line = status.lines().find_map(|l| l.strip_prefix(name))?;
        line.split_whitespace().map(|g| g.parse().ok()).collect()
    };
    let effective = |name: &str| field(name).and_then(|v| v.get(1).copied());
    if effective("Uid:")? != uid || effective("Gid:")? != gid {
        return None;
    }
    field("Groups:")
}

/// The supplementary groups of process `pid` (whose effective ids are `uid` and
/// `gid`), or an empty list when unreadable or no longer that process.
pub fn process_groups(pid: i32, uid: u32, gid: u32) -> Vec<u32> {
    let path = Path::new("/proc").join(pid.to_string()).join("status");
    std::fs::read_to_string(path).ok().and_then(|s| groups_in_status(&s, uid, gid)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_or_admin_group_only() {
        let admin = Some(990);
        let user = Client { uid: 1000, gid: 1000, groups: vec![100, 991] };
        assert!(!user.may_change(admin));
        assert!(Client { groups: vec![100, 990], ..user }.may_change(admin));
        assert!(Client { gid: 990, ..user.clone() }.may_change(admin));
        assert!(Client { uid: 0, ..user.clone() }.may_change(None));
        assert!(!Client { groups: vec![990], ..user }.may_change(None));
    }

    #[test]
    fn group_file_and_proc_status_parse() {
        let etc = "root:x:0:\nweft:x:991:\nweft-admin:x:990:alice,bob\nbroken\n";
        assert_eq!(group_id_in(etc, "weft-admin"), Some(990));
        assert_eq!(group_id_in(etc, "weft"), Some(991));
        assert_eq!(group_id_in(etc, "weft-admins"), None);
        assert_eq!(group_id_in(etc, "broken"), None);
        let status =
            "Name:\tweft\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\t100\t100\t100\nGroups:\t4 27 990 \nNSpid:\t1\n";
        assert_eq!(groups_in_status(status, 1000, 100), Some(vec![4, 27, 990]));
        // Another process behind a reused pid: not believed.
        assert_eq!(groups_in_status(status, 1001, 100), None);
        assert_eq!(groups_in_status(status, 1000, 101), None);
        let empty = "Uid:\t5\t5\t5\t5\nGid:\t6\t6\t6\t6\nGroups:\t\n";
        assert_eq!(groups_in_status(empty, 5, 6), Some(vec![]));
        assert_eq!(groups_in_status("Name:\tx\n", 0, 0), None);
        // Our own process: its status has our ids and a Groups line.
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        let ids = |name: &str| -> u32 {
            let l = own.lines().find_map(|l| l.strip_prefix(name)).unwrap();
            l.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        assert!(groups_in_status(&own, ids("Uid:"), ids("Gid:")).is_some());
    }
}
