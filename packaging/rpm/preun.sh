# %preun for weft: on erase ($1 = 0), stop the nodes before their binary goes away.
if [ "$1" -eq 0 ] && [ -d /run/systemd/system ]; then
    systemctl stop weft.service 'weft@*.service' >/dev/null 2>&1 || :
fi
