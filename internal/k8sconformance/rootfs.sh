#!/usr/bin/env bash
# rootfs.sh OUT: writes OUT, a tar archive of a Debian 12 (bookworm) root file system that
# mmdebstrap builds from the host's apt sources: the base of the images `make k8s-conformance`
# rebuilds (package e2eimages). Its packages are what the sig-network specs run in agnhost
# (upstream: Alpine with bind-tools curl netcat-openbsd iproute2 iperf bash socat), in
# glibc-dns-testing (upstream: Debian bookworm with dnsutils) and in nginx. agnhost's
# Dockerfile adds user-defined-in-image (1000) in group-defined-in-image (50000): so does this.
# Times are clamped to Epoch (SOURCE_DATE_EPOCH); no documentation, manual pages or locales.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUT" >&2; exit 2; }
out=$1
packages=(
	bind9-dnsutils # dig, nslookup
	curl wget
	netcat-openbsd socat
	iproute2 iputils-ping
	iperf
	procps
	nginx-light # the nginx image
)
sources=/etc/apt/sources.list.d/debian.sources
[ -f "$sources" ] || sources=/etc/apt/sources.list
mkdir -p "$(dirname "$out")"
include=$(IFS=,; echo "${packages[*]}")
# Merged /usr as debootstrap sets it up, without the usrmerge package (and the perl it needs).
SOURCE_DATE_EPOCH=0 mmdebstrap --quiet --variant=minbase --mode=root --format=tar --skip=output/dev \
	--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr --dpkgopt=force-unsafe-io \
	--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
	--dpkgopt='path-exclude=/usr/share/locale/*' --include="$include" \
	--customize-hook='chroot "$1" groupadd -g 50000 group-defined-in-image' \
	--customize-hook='chroot "$1" useradd -u 1000 -G group-defined-in-image user-defined-in-image' \
	bookworm "$out.tmp" "$sources" </dev/null
mv "$out.tmp" "$out"
