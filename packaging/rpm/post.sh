# %post for weft: create the weft group (members may read the node's status through
# the control socket) and weft-admin (members may also change the node), reload
# systemd, and leave the service alone until the admin has set a secret.
getent group weft >/dev/null || groupadd -r weft
getent group weft-admin >/dev/null || groupadd -r weft-admin
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
if ! grep -Eq "^[[:space:]]*network-secret[[:space:]]*=[[:space:]]*(\"[^\"]+\"|'[^']+')" /etc/weft/weft.toml 2>/dev/null; then
    echo "weft: the node is not started: edit /etc/weft/weft.toml (network-name, network-secret, ipv4),"
    echo "weft: then run: systemctl enable --now weft"
fi
