// Prints what the shim's reader of the program's file (cabi/shim/conf.c, linked in) has for each
// key named on the command line: "key=value", or "key" alone when it has none.
#include <stdio.h>

const char *softefa_conf(const char *key);

int main(int argc, char **argv) {
	for (int i = 1; i < argc; i++) {
		const char *v = softefa_conf(argv[i]);
		if (v)
			printf("%s=%s\n", argv[i], v);
		else
			printf("%s\n", argv[i]);
	}
	return 0;
}
