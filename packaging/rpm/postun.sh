# %postun for weft: reload systemd; on upgrade ($1 >= 1), restart running nodes.
# The weft and weft-admin groups, /var/lib/weft (node keys) and changed configs (.rpmsave) are kept.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
    if [ "$1" -ge 1 ]; then
        systemctl try-restart weft.service 'weft@*.service' >/dev/null 2>&1 || :
    fi
fi
