/*
 * Hadoop's local file system for millwheel's local sessions (millwheel/runtime/_worker_home.py).
 *
 * Without Hadoop's native library (a pip-installed PySpark has none), RawLocalFileSystem
 * sets a permission by starting a `chmod` process: once for every file it creates and
 * every directory it makes, twice with the checksum file beside it. A micro-batch writes
 * its offset log, its commit log, a log per file source and a state file per key interval,
 * so a query started ~16 processes a batch, ~9.5 ms a file (docs/performance.md, "Latency").
 * This one sets the same permission bits with java.nio, in the JVM; anything else (the
 * sticky and set-id bits, a file system without POSIX permissions) is left to Hadoop's
 * own code. Compiled with `javac --release 17` when the Spark home is built.
 */
package millwheel.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/** {@link LocalFileSystem} (checksums and all) over {@link Raw}. */
public class NioLocalFileSystem extends LocalFileSystem {
  public NioLocalFileSystem() {
    super(new Raw());
  }

  /** {@link RawLocalFileSystem} whose {@code setPermission} starts no process. */
  public static class Raw extends RawLocalFileSystem {
    private static final String RWX = "rwxrwxrwx";

    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      int mode = permission.toShort();
      if ((mode & ~0777) != 0) {
        super.setPermission(p, permission);
        return;
      }
      StringBuilder text = new StringBuilder(9);
      for (int i = 0; i < 9; i++) {
        text.append((mode & (0400 >> i)) != 0 ? RWX.charAt(i) : '-');
      }
      try {
        Files.setPosixFilePermissions(
            pathToFile(p).toPath(), PosixFilePermissions.fromString(text.toString()));
      } catch (UnsupportedOperationException e) {
        super.setPermission(p, permission);
      }
    }
  }
}
