#!/bin/sh
# llmfleet preflight: Secure Boot state, and whether DKMS's module signing key
# is enrolled, as one JSON object. Read-only.
#   state:    enabled | disabled | no-efi (legacy BIOS boot, or a container) | unknown
#   source:   mokutil | efivars | none
#   dkms_key: enrolled | not-enrolled | absent (DKMS made no key yet) | unknown
set -u
state=unknown
source=none
if [ ! -d /sys/firmware/efi ]; then
  state=no-efi
elif command -v mokutil >/dev/null 2>&1; then
  source=mokutil
  case "$(mokutil --sb-state 2>&1 || true)" in
    *"SecureBoot enabled"*) state=enabled ;;
    *"SecureBoot disabled"*) state=disabled ;;
  esac
else
  # The EFI variable's 4 attribute bytes, then 1 (enabled) or 0 (disabled).
  variable=/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c
  if [ -r "$variable" ]; then
    source=efivars
    case "$(od -An -t u1 -j4 -N1 "$variable" | tr -d ' \n')" in
      1) state=enabled ;;
      0) state=disabled ;;
    esac
  fi
fi
key=absent
if [ -r "${1:-/var/lib/dkms/mok.pub}" ]; then
  key=unknown
  if [ "$source" = mokutil ]; then
    case "$(mokutil --test-key "${1:-/var/lib/dkms/mok.pub}" 2>&1 || true)" in
      *"already enrolled"*) key=enrolled ;;
      *) key=not-enrolled ;;
    esac
  fi
fi
printf '{"state": "%s", "source": "%s", "dkms_key": "%s"}\n' "$state" "$source" "$key"
