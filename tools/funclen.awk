# Prints "file:line name length" for every function whose body is longer
# than max lines (awk -v max=80 -f tools/funclen.awk FILES). A function is a
# line starting with "name(" after a line holding its return type, its body
# the lines between a "{" and a "}" alone in column 0 (clang-format's style
# here, checked beside this).
FNR == 1 { name = ""; start = 0; prev = "" }
/^[a-z_][a-z0-9_]*\(/ && prev !~ /^#/ && prev !~ /^$/ { name = $0; sub(/\(.*/, "", name); line = FNR }
$0 == "{" && name != "" { start = FNR }
$0 == "}" && start {
    if (FNR - start - 1 > max)
        printf "%s:%d %s %d\n", FILENAME, line, name, FNR - start - 1
    name = ""; start = 0
}
{ prev = $0 }
