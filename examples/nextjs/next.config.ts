import path from "node:path";
import type { NextConfig } from "next";

const config: NextConfig = {
  // `@spool/ai-sdk` is installed from ../../clients/typescript (a symlink): the repository is
  // the root Turbopack may read files from. An app that installs the package from a registry
  // or a tarball needs neither this nor `outputFileTracingRoot`.
  turbopack: { root: path.join(__dirname, "../..") },
  outputFileTracingRoot: path.join(__dirname, "../.."),
};

export default config;
