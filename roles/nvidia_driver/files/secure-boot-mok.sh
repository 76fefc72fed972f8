#!/bin/sh
# llmfleet nvidia_driver: Secure Boot's state and, for each DKMS signing key
# given as an argument, whether the firmware's MOK list has it, as one JSON
# object. Read-only.
#   state: enabled | disabled | no-efi (legacy BIOS boot, or a container) | unknown
#   keys:  {path: enrolled | pending (imported, confirmed at the next boot) |
#          not-enrolled | absent | unknown (no mokutil)}
set -u
state=unknown
if [ ! -d /sys/firmware/efi ]; then
  state=no-efi
elif command -v mokutil >/dev/null 2>&1; then
  case "$(mokutil --sb-state 2>&1 || true)" in
    *"SecureBoot enabled"*) state=enabled ;;
    *"SecureBoot disabled"*) state=disabled ;;
  esac
fi
printf '{"state": "%s", "keys": {' "$state"
separator=
for key in "$@"; do
  status=absent
  if [ -r "$key" ]; then
    status=unknown
    if command -v mokutil >/dev/null 2>&1; then
      case "$(mokutil --test-key "$key" 2>&1 || true)" in
        *"already enrolled"*) status=enrolled ;;
        *"enrollment request"*) status=pending ;;
        *) status=not-enrolled ;;
      esac
    fi
  fi
  printf '%s"%s": "%s"' "$separator" "$key" "$status"
  separator=', '
done
printf '}}\n'
