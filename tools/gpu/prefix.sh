# Sourced by session.sh and cpu-bench.sh on the GPU machine (never run on
# its own): unpacks .gpu-debs/*.deb into the prefix $P with dpkg -x (never
# into /), and points the compiler, CMake, pkg-config and the loader at it;
# finds NCCL in the toolkit or pip's package. Needs `step` and $P, $OUT.
step "unpacking .gpu-debs into $P"
debs=(.gpu-debs/*.deb)
if [ ! -e "${debs[0]}" ]; then
  echo "no .gpu-debs/*.deb here: run tools/gpu/fetch-debs.sh on a machine with a registry and carry .gpu-debs"
else
  mkdir -p "$P"
  for f in "${debs[@]}"; do dpkg -x "$f" "$P" || echo "dpkg -x $f failed"; done
  # .pc files name /usr; make them name the prefix (prefix= lines and
  # absolute libdir=/includedir= lines alike).
  find "$P" -name '*.pc' -exec sed -i "s|^prefix=/usr\$|prefix=$P/usr|; s|=/usr/|=$P/usr/|" {} +
fi
ML=x86_64-linux-gnu
export CMAKE_PREFIX_PATH="$P/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
# OpenBLAS lives in a subdirectory that update-alternatives would link into
# the usual place; dpkg -x runs no maintainer scripts, so name it directly.
export CMAKE_INCLUDE_PATH="$P/usr/include/$ML/openblas-pthread:$P/usr/include"
export CMAKE_LIBRARY_PATH="$P/usr/lib/$ML/openblas-pthread:$P/usr/lib/$ML"
export C_INCLUDE_PATH="$P/usr/include:$P/usr/include/$ML${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}"
export LIBRARY_PATH="$P/usr/lib/$ML/openblas-pthread:$P/usr/lib/$ML${LIBRARY_PATH:+:$LIBRARY_PATH}"
# At run time only the libraries the image lacks come from the prefix (a
# directory of links to them): putting the whole prefix first would make the
# image's own programs (python3, cmake) load Debian 12's zlib or libgfortran.
mkdir -p "$P/runtime"
have=$(ldconfig -p 2>/dev/null | awk 'NR > 1 {print $1}')
for f in "$P"/usr/lib/$ML/*.so.[0-9] "$P"/lib/$ML/*.so.[0-9]; do # soname links (libyaml-0.so.2, libz.so.1, ...)
  [ -e "$f" ] || continue
  so=$(basename "$f")
  grep -qxF "$so" <<<"$have" || ln -sf "$f" "$P/runtime/$so"
done
echo "from the prefix at run time: $(ls "$P/runtime" | tr '\n' ' ')"
export LD_LIBRARY_PATH="$P/usr/lib/$ML/openblas-pthread:$P/runtime${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$P/usr/lib/$ML/pkgconfig:$P/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
if ! command -v pkg-config >/dev/null && [ -x "$P/usr/bin/pkgconf" ]; then
  mkdir -p "$P/bin"
  printf '#!/bin/sh\nexec "%s/usr/bin/pkgconf" "$@"\n' "$P" >"$P/bin/pkg-config"
  chmod +x "$P/bin/pkg-config"
  export PATH="$P/bin:$PATH"
fi
export PATH="/usr/local/cuda/bin:$PATH"
# NCCL: in the toolkit, else pip's nvidia-nccl package (the image has it).
if [ -z "${NCCL_ROOT:-}" ] && [ ! -e /usr/local/cuda/include/nccl.h ]; then
  d=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)
  [ -z "$d" ] && d=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
  if [ -n "$d" ] && [ -e "$d/include/nccl.h" ]; then
    export NCCL_ROOT=$d LD_LIBRARY_PATH="$d/lib:$LD_LIBRARY_PATH"
    echo "NCCL from pip: $d"
  else
    echo "NCCL: not found (the nccl communicator is left out of this build)"
  fi
fi
