# %post for weft: create the weft group (members may use the control socket),
# reload systemd, and leave the service alone until the admin has set a secret.
getent group weft >/dev/null || groupadd -r weft
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
if ! grep -Eq "^[[:space:]]*network-secret[[:space:]]*=[[:space:]]*(\"[^\"]+\"|'[^']+')" /etc/weft/weft.toml 2>/dev/null; then
    echo "weft: the node is not started: edit /etc/weft/weft.toml (network-name, network-secret, ipv4),"
    echo "weft: then run: systemctl enable --now weft"
fi
