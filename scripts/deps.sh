# Sourced by scripts/bench.sh (and usable by scripts/test.sh): installs the
# servers rmsgrad runs against when they are missing (redis-server from
# Debian, versitygw built with go install at a pinned version) and exports
# their paths in the variables internal/testenv and cmd/bench read.
# Expects bash with set -euo pipefail.

export PATH="$PATH:$(go env GOPATH)/bin"

deps_apt_updated=0
deps_apt_install() {
	if [ "$deps_apt_updated" = 0 ]; then apt-get update -qq; deps_apt_updated=1; fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# deps_servers installs redis-server and versitygw when missing.
deps_servers() {
	command -v redis-server >/dev/null || deps_apt_install redis-server
	local want=v1.8.0
	if ! command -v versitygw >/dev/null || ! versitygw --version 2>/dev/null | grep -q "${want#v}"; then
		echo "building versitygw ${want} (a few minutes the first time)"
		(cd /tmp && go install "github.com/versity/versitygw/cmd/versitygw@${want}")
	fi
	export RMSGRAD_REDIS_SERVER="$(command -v redis-server)"
	export RMSGRAD_VERSITYGW="$(command -v versitygw)"
}

# deps_cxx installs g++ (the msl-cpu backend compiles the Metal shader as C++).
deps_cxx() {
	command -v g++ >/dev/null || deps_apt_install g++
}
