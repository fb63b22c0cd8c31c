#!/usr/bin/env bash
# Start a new plugin crate from a cclkit template.
#
#   examples/new-plugin.sh KIND NAME [ROOT]      (what `make new-plugin KIND=.. NAME=..` runs)
#
# KIND is `net` or `tuner`; NAME is lowercase letters, digits and dashes ("foo",
# "my-net"). ROOT is the workspace (default: the directory above this script).
#
# Creates plugins/NAME from examples/KIND-template, renamed throughout:
#   crate nccl-KIND-NAME (cdylib libnccl_KIND_NAME.so), table name "NAME",
#   type <Name>Net / <Name>Tuner, environment variables NAME_UPPER_* (the template's
#   CCLKIT_TEMPLATE_*, e.g. FOO_IP), helper threads and log prefixes "NAME ...";
# adds it to the workspace members and to the Makefile's PLUGINS table, so that
# `make package` installs build/lib/libnccl-KIND-NAME.so (and librccl-net-NAME.so for
# net) and `cclkit check build/lib/libnccl-KIND-NAME.so` passes unchanged.
set -euo pipefail

usage() {
  echo "usage: make new-plugin KIND=net|tuner NAME=foo   (NAME: a-z, 0-9, '-'; starts with a letter)" >&2
  exit 2
}

kind="${1:-}"
name="${2:-}"
root="${3:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"

case "$kind" in net | tuner) ;; *) usage ;; esac
[[ "$name" =~ ^[a-z][a-z0-9-]{0,30}$ ]] || usage
[[ "$name" != *- ]] || usage
case "$name" in template | cclkit | cclkit-*)
  echo "new-plugin: '$name' is taken by cclkit's own plugins; pick another name" >&2
  exit 2
  ;;
esac

src="$root/examples/$kind-template"
dest="$root/plugins/$name"
crate="nccl-$kind-$name"
lib="${crate//-/_}"
upper="$(tr 'a-z-' 'A-Z_' <<<"$name")"
camel="$(awk -F- '{ for (i = 1; i <= NF; i++) printf "%s%s", toupper(substr($i, 1, 1)), substr($i, 2) }' <<<"$name")"
type_suffix="$( [ "$kind" = net ] && echo Net || echo Tuner )"

[ -d "$src" ] || { echo "new-plugin: template $src not found" >&2; exit 1; }
[ -e "$dest" ] && { echo "new-plugin: $dest already exists" >&2; exit 1; }
grep -q "\"plugins/$name\"" "$root/Cargo.toml" && { echo "new-plugin: plugins/$name is already a workspace member" >&2; exit 1; }
grep -q "^ *$lib:" "$root/Makefile" && { echo "new-plugin: $lib is already in the Makefile's PLUGINS" >&2; exit 1; }

mkdir -p "$dest/src"
cp "$src/Cargo.toml" "$dest/Cargo.toml"
cp "$src/src/lib.rs" "$dest/src/lib.rs"

# Cargo.toml: the crate name decides the cdylib file name (libnccl_KIND_NAME.so).
sed -i \
  -e "s/^name = \"cclkit-$kind-template\"/name = \"$crate\"/" \
  -e "s/^description = .*/description = \"$name $kind plugin, started from cclkit's $kind template\"/" \
  "$dest/Cargo.toml"

# lib.rs: environment variables first, then the table name, the type, the rest.
sed -i \
  -e "s/CCLKIT_TEMPLATE_/${upper}_/g" \
  -e "s/c\"TemplateTuner\"/c\"$name\"/; s/c\"Template\"/c\"$name\"/" \
  -e "s/Template$type_suffix/$camel$type_suffix/g" \
  -e "s/template/$name/g" \
  "$dest/src/lib.rs"

if grep -qi template "$dest/src/lib.rs"; then
  echo "new-plugin: warning: 'template' is still mentioned in $dest/src/lib.rs:" >&2
  grep -ni template "$dest/src/lib.rs" >&2 || true
fi
# Renamed identifiers change line lengths: keep the crate rustfmt-clean.
if command -v rustfmt >/dev/null; then rustfmt --edition 2024 "$dest/src/lib.rs" || true; fi

if [ "$kind" = net ]; then
  knobs="- \`${upper}_IP\`: the address of the one device (default 127.0.0.1; \`cclkit check\`'s
  namespace check sets it for its peers)."
  names="\`build/lib/libnccl-net-$name.so\` (NCCL) and \`build/lib/librccl-net-$name.so\` (RCCL)"
  use="\`NCCL_NET_PLUGIN=$name\` (NCCL finds \`libnccl-net-$name.so\`), \`NCCL_NET=$name\` to insist on it"
else
  knobs="- \`${upper}_THRESHOLD\`: bytes below which tree/LL is preferred (default 65536).
- \`${upper}_CHANNELS\`: channel count to ask for (0 = NCCL's own)."
  names="\`build/lib/libnccl-tuner-$name.so\`"
  use="\`NCCL_TUNER_PLUGIN=$name\` (NCCL finds \`libnccl-tuner-$name.so\`)"
fi
cat >"$dest/README.md" <<EOF
# $name

A $kind plugin started from cclkit's \`examples/$kind-template\` by \`make new-plugin\`.
It builds as is: replace the logic in \`src/lib.rs\`, keep the \`export_$kind!\` line.

- Build and package: \`make package\` installs $names.
- Check it: \`cclkit check build/lib/libnccl-$kind-$name.so\` (every ABI version it exports).
- Use it: $use.

Environment:
$knobs
EOF

# Workspace members: insert before the closing bracket of `members = [`.
awk -v member="    \"plugins/$name\"," '
  /^members = \[/ { inside = 1 }
  inside && /^\]/ { print member; inside = 0 }
  { print }
' "$root/Cargo.toml" >"$root/Cargo.toml.new-plugin" && mv "$root/Cargo.toml.new-plugin" "$root/Cargo.toml"

# Makefile PLUGINS table: append an entry after its last continued line.
awk -v entry="  $lib:$kind:$name" '
  /^PLUGINS[ \t]*:=/ { inside = 1 }
  inside && !/\\$/ { print $0 " \\"; print entry; inside = 0; next }
  { print }
' "$root/Makefile" >"$root/Makefile.new-plugin" && mv "$root/Makefile.new-plugin" "$root/Makefile"

grep -q "\"plugins/$name\"" "$root/Cargo.toml" || { echo "new-plugin: could not add plugins/$name to Cargo.toml members" >&2; exit 1; }
grep -q "^  $lib:$kind:$name\$" "$root/Makefile" || { echo "new-plugin: could not add $lib to the Makefile's PLUGINS" >&2; exit 1; }

echo "created plugins/$name (crate $crate, table name \"$name\", type $camel$type_suffix)"
echo "added it to the workspace members and to PLUGINS in the Makefile"
echo "next: make package && cclkit check build/lib/libnccl-$kind-$name.so"
