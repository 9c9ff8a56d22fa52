#!/usr/bin/env bash
# Builds the soft-RoCE guest image into OUT (scripts/softroce-vm calls it when
# the cached image's inputs changed): a debootstrap root of Debian's PACKAGES,
# KERNEL_PKG's kernel and only the modules the guest loads, and
# scripts/softroce/guest-init as /init, packed as a zstd initramfs.
#
#   build-image.sh OUT KERNEL_PKG SUITE MIRROR PACKAGE...
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$1" KERNEL_PKG="$2" SUITE="$3" MIRROR="$4"
shift 4
PACKAGES=("$@")
die() {
  echo "softroce-vm: $*" >&2
  exit 2
}
log() { echo "softroce-vm: $*" >&2; }

# The modules the guest loads, in this order (guest-init reads them from
# /etc/rf-modules), with everything they depend on. rxe computes its ICRC with
# the kernel's "crc32" hash, which a module provides: without it rxe's device
# registration fails with ENOENT.
GUEST_MODULES=(virtio_pci virtio_net 9pnet_virtio 9p configfs crc32_generic crc32_pclmul
  rdma_rxe ib_uverbs rdma_ucm)
module_closure() {  # module_closure MODULES_DIR
  local dir="$1" todo=() seen=" " m path deps
  for m in "${GUEST_MODULES[@]}"; do todo+=("$m"); done
  while [ ${#todo[@]} -gt 0 ]; do
    m="${todo[0]}"
    todo=("${todo[@]:1}")
    m="${m//-/_}"
    case "$seen" in *" $m "*) continue ;; esac
    seen="$seen$m "
    path=$(awk -F: -v m="$m" '{n=$1; sub(/.*\//, "", n); sub(/\.ko(\..*)?$/, "", n); gsub(/-/, "_", n);
                               if (n == m) {print $1; exit}}' "$dir/modules.dep")
    [ -n "$path" ] || {
      grep -q "/$m.ko" "$dir/modules.builtin" 2>/dev/null && continue
      die "kernel module $m not found in $dir (neither a module nor built in)"
    }
    echo "$path"
    deps=$(awk -F: -v p="$path" '$1 == p {print $2; exit}' "$dir/modules.dep")
    for d in $deps; do
      d="${d##*/}"
      todo+=("${d%%.ko*}")
    done
  done
}

tmp="$OUT.building"
rm -rf "$tmp" "$OUT" "$OUT.new"
mkdir -p "$tmp/dl"
trap 'rm -rf "$tmp"' EXIT
log "building the guest image (debootstrap $SUITE from $MIRROR, $KERNEL_PKG); once per input change"
include=$(IFS=,; echo "${PACKAGES[*]}")
debootstrap --variant=minbase --include="$include" "$SUITE" "$tmp/rootfs" "$MIRROR" \
  >"$tmp/debootstrap.log" 2>&1 || {
  tail -20 "$tmp/debootstrap.log" >&2
  die "debootstrap failed (log above; a package name or the mirror $MIRROR may be wrong)"
}

log "adding $KERNEL_PKG's kernel and the ${#GUEST_MODULES[@]} modules the guest loads"
(cd "$tmp/dl" && apt-get download -q "$KERNEL_PKG" >/dev/null 2>&1) ||
  die "apt-get download $KERNEL_PKG failed"
# The package has no modules.dep (its postinst makes it): depmod it inside
# the root, whose kmod is Debian's, then keep only the modules needed.
dpkg-deb -x "$tmp"/dl/*.deb "$tmp/rootfs/tmp/kernel"
kver=$(ls "$tmp/rootfs/tmp/kernel/lib/modules")
chroot "$tmp/rootfs" depmod -b /tmp/kernel "$kver" || die "depmod of $KERNEL_PKG failed"
mods="$tmp/rootfs/tmp/kernel/lib/modules/$kver"
dst="$tmp/rootfs/lib/modules/$kver"
mkdir -p "$dst"
cp "$mods"/modules.order "$mods"/modules.builtin* "$dst"/
module_closure "$mods" | while read -r rel; do
  mkdir -p "$dst/$(dirname "$rel")"
  cp "$mods/$rel" "$dst/$rel"
done
chroot "$tmp/rootfs" depmod "$kver" || die "depmod $kver failed in the guest root"
cp "$tmp/rootfs/tmp/kernel/boot/vmlinuz-$kver" "$tmp/vmlinuz"
rm -rf "$tmp/rootfs/tmp/kernel"

# What a guest never reads.
rm -rf "$tmp"/rootfs/usr/share/{doc,man,info,locale,lintian,bash-completion} \
  "$tmp"/rootfs/var/cache/apt/* "$tmp"/rootfs/var/lib/apt/lists/*
install -m 0755 "$HERE/guest-init" "$tmp/rootfs/init"
printf '%s\n' "${GUEST_MODULES[@]}" >"$tmp/rootfs/etc/rf-modules"
log "packing the root as the initramfs"
(cd "$tmp/rootfs" && find . -print0 | cpio --null -o -H newc --quiet | zstd -q -T0 -3) \
  >"$tmp/initrd.zst"
mkdir -p "$OUT.new"
mv "$tmp/initrd.zst" "$OUT.new/initrd.zst"
mv "$tmp/vmlinuz" "$OUT.new/vmlinuz"
printf '%s\n' "${PACKAGES[@]}" >"$OUT.new/packages"
echo "$kver" >"$OUT.new/kernel-version"
mv "$OUT.new" "$OUT"
log "image ready: $OUT ($(du -sh "$OUT/initrd.zst" | cut -f1) initramfs, kernel $kver)"

