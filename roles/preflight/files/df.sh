#!/bin/sh
# llmfleet preflight: for each path given, the filesystem that holds it (or
# would hold it: the nearest existing parent), one tab-separated line each:
#   path  mount point  available KiB  size KiB
# Read-only. (Ansible's mount facts leave out overlay and tmpfs filesystems:
# a container's root and /dev/shm among them; df does not.)
set -eu
for path in "$@"; do
  probe=$path
  while [ ! -e "$probe" ]; do probe=$(dirname "$probe"); done
  df -P -k "$probe" | awk -v path="$path" 'NR == 2 { printf "%s\t%s\t%s\t%s\n", path, $6, $4, $2 }'
done
