#!/usr/bin/env bash
# release.sh BIN_DIR IMAGES_DIR TARBALL: writes knext's release tarball TARBALL
# (.../knext-<tag>-linux-<arch>.tar.gz) and TARBALL.sha256sum (`sha256sum -c` checks it), then
# lists the tarball. Laid out like containerd's release tarball, to be extracted into /usr/local:
#
#   bin/containerd, bin/containerd-shim-runc-v2, bin/ctr, bin/nri-bridge   (BIN_DIR, `make build`)
#   lib/systemd/system/containerd.service, lib/systemd/system/nri-bridge.service
#   share/knext/config.toml                      example /etc/containerd/config.toml
#   share/knext/nri-bridge/bridge.conf           nri-bridge's example configuration
#   share/knext/nri-bridge/static-pod.yaml, daemonset.yaml   with the release's image tag
#   share/knext/images/nri-bridge.tar            knext.local/nri-bridge:<tag> (IMAGES_DIR)
#   share/doc/knext/                             release.md, cni-less.md, configuration.md
#
# Owners, modes, timestamps (the commit's) and order are fixed: the same inputs give the same
# tarball.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
[ $# = 3 ] || { echo "usage: $0 BIN_DIR IMAGES_DIR TARBALL" >&2; exit 2; }
bin=$1 images=$2 tarball=$3
name=$(basename "$tarball" .tar.gz)
tag=${name#knext-}
tag=${tag%-linux-*}
image=$(tar -xOf "$images/nri-bridge.tar" index.json | sed -n 's/.*"io.containerd.image.name":"\([^"]*\)".*/\1/p')
[ "$image" = "knext.local/nri-bridge:$tag" ] ||
	{ echo "$images/nri-bridge.tar holds image '$image', not knext.local/nri-bridge:$tag: run make images" >&2; exit 1; }

mkdir -p "$(dirname "$tarball")"
stage=$(mktemp -d "$(dirname "$tarball")/.stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
install -d "$stage/bin" "$stage/lib/systemd/system" "$stage/share/knext/nri-bridge" \
	"$stage/share/knext/images" "$stage/share/doc/knext"
for b in containerd containerd-shim-runc-v2 ctr nri-bridge; do
	install -m 0755 "$bin/$b" "$stage/bin/$b"
done
install -m 0644 "$root/deploy/release/containerd.service" "$root/deploy/nri-bridge/nri-bridge.service" \
	"$stage/lib/systemd/system/"
install -m 0644 "$root/deploy/release/config.toml" "$stage/share/knext/config.toml"
install -m 0644 "$root/deploy/nri-bridge/bridge.conf" "$stage/share/knext/nri-bridge/bridge.conf"
for manifest in static-pod.yaml daemonset.yaml; do
	sed "s|knext.local/nri-bridge:VERSION|$image|" "$root/deploy/nri-bridge/$manifest" >"$stage/share/knext/nri-bridge/$manifest"
	grep -q "image: $image\$" "$stage/share/knext/nri-bridge/$manifest" ||
		{ echo "deploy/nri-bridge/$manifest: no image knext.local/nri-bridge:VERSION to set" >&2; exit 1; }
done
install -m 0644 "$images/nri-bridge.tar" "$stage/share/knext/images/nri-bridge.tar"
install -m 0644 "$root/docs/release.md" "$root/docs/cni-less.md" "$root/docs/configuration.md" "$stage/share/doc/knext/"

mtime=$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$mtime" -C "$stage" -cf - bin lib share |
	gzip -n -9 >"$tarball.tmp"
mv "$tarball.tmp" "$tarball"
(cd "$(dirname "$tarball")" && sha256sum "$(basename "$tarball")" >"$(basename "$tarball").sha256sum")
echo "release: $tarball"
cat "$tarball.sha256sum"
tar -tvzf "$tarball"
