#!/bin/sh
# llmfleet preflight: the NVIDIA display controllers on the PCI bus (vendor
# 0x10de, class 0x03xxxx: VGA or 3D controller; NVSwitches are bridges and do
# not count), one per line: slot, device id, class, bound kernel driver.
# Reads sysfs only; needs no lspci.
set -eu
for device in /sys/bus/pci/devices/*; do
  [ -r "$device/vendor" ] || continue
  vendor=$(cat "$device/vendor")
  class=$(cat "$device/class")
  case "$vendor:$class" in
    0x10de:0x03*)
      driver=none
      [ -e "$device/driver" ] && driver=$(basename "$(readlink "$device/driver")")
      echo "${device##*/} $(cat "$device/device") $class $driver"
      ;;
  esac
done
