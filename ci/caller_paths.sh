# Sourced by ci/test.sh and ci/conformance.sh, with $caller the folder they were started from, before they cd into
# the checkout: relative PYTHONPATH entries (a plugin in the user's own repository) and a relative MOE_PYTHON path
# name the caller's folders, as they would for a pytest started there; path arguments name the checkout's.
if [ -n "${PYTHONPATH:-}" ]; then
  resolved=()
  IFS=: read -r -a entries <<< "$PYTHONPATH"
  for entry in "${entries[@]}"; do
    [ -z "$entry" ] && continue
    case "$entry" in /*) resolved+=("$entry") ;; *) resolved+=("$(cd "$caller" && cd "$entry" 2>/dev/null && pwd || echo "$caller/$entry")") ;; esac
  done
  PYTHONPATH="$(IFS=:; echo "${resolved[*]}")"
  export PYTHONPATH
fi
# a path (it has a slash) against the caller's folder; a bare name is looked up on PATH
case "${MOE_PYTHON:-}" in
  /*) ;;
  */*) MOE_PYTHON="$caller/$MOE_PYTHON" && export MOE_PYTHON ;;
esac
