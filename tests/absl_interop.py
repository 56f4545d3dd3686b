#!/usr/bin/python3
"""absl interoperability helper for tests/handoff_test.cpp (run by /usr/bin/python3).

  absl_interop.py write-ncf PATH
      Writes PATH exactly as TensorFlow models' NCF main job writes its flag file
      (official/recommendation/data_preprocessing.py, write_flagfile): one
      "--{}={}\\n".format(k, v) per entry, so values are Python's str(): True/False,
      1e-05, 0.5, None. Written to a temp name and renamed, as NCF does. The values are
      NCF_FLAGS below; the C++ test asserts each one.

  absl_interop.py absl-read PATH TYPE:NAME...
      Defines each NAME as an absl flag of TYPE (int, float, bool, string), parses
      ['prog', '--flagfile=PATH'] with absl itself, and prints the parsed values as one
      JSON object (ensure_ascii, floats as repr) for the C++ test to compare.

Exit status: 0 on success, 3 when absl rejects the file (its message on stderr), 2 on
usage errors.
"""

import json
import os
import sys

# What the NCF main job puts in its flags_ dict (data_preprocessing.instantiate_pipeline),
# plus a float of each shape str() gives and a None (NCF writes a seed or leaves it None).
NCF_FLAGS = [
    ("data_dir", "/data/movielens ml-20m"),
    ("cache_id", 1528841970),
    ("num_neg", 4),
    ("num_train_positives", 19861770),
    ("num_items", 26744),
    ("num_users", 138493),
    ("num_readers", 8),
    ("epochs_per_cycle", 1),
    ("num_cycles", 14),
    ("train_batch_size", 98304),
    ("eval_batch_size", 160000),
    ("num_workers", 6),
    ("redirect_logs", True),
    ("use_tf_logging", False),
    ("ml_perf", False),
    ("output_ml_perf_compliance_logging", True),
    ("learning_rate", 1e-05),
    ("beta1", 0.5),
    ("epsilon", 1e-08),
    ("big", 1e20),
    ("negative", -2.5),
    ("seed", None),
]


def write_ncf(path):
    temp = path + ".temp"
    with open(temp, "w", encoding="utf-8") as f:
        for k, v in NCF_FLAGS:
            f.write("--{}={}\n".format(k, v))
    os.rename(temp, path)


def absl_read(path, specs):
    from absl import flags  # imported here: write-ncf must work without absl

    values = flags.FlagValues()
    define = {
        "int": flags.DEFINE_integer,
        "float": flags.DEFINE_float,
        "bool": flags.DEFINE_boolean,
        "string": flags.DEFINE_string,
    }
    names = []
    for spec in specs:
        kind, _, name = spec.partition(":")
        if kind not in define or not name:
            print("bad flag spec %r (want TYPE:NAME)" % spec, file=sys.stderr)
            return 2
        define[kind](name, None, "interop flag", flag_values=values)
        names.append(name)
    try:
        values(["prog", "--flagfile=" + path])
    except flags.Error as e:
        print("absl rejected %s: %s" % (path, e), file=sys.stderr)
        return 3
    print(json.dumps({n: values[n].value for n in names}, ensure_ascii=True))
    return 0


def main(argv):
    if len(argv) >= 3 and argv[1] == "write-ncf":
        write_ncf(argv[2])
        return 0
    if len(argv) >= 3 and argv[1] == "absl-read":
        return absl_read(argv[2], argv[3:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
