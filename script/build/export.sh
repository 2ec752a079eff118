#!/usr/bin/env bash
# export.sh BUILDDIR PATCHDIR: export every tree's series from BUILDDIR/src into PATCHDIR/<tree>.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
for name in $(module_names); do
	export_series "$1/src/$name" "$name" "$2/$name"
	echo "exported $name: $(find "$2/$name" -name '*.patch' | wc -l) patch(es)"
done
