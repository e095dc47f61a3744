"""Running compiled programs: the PJRT calls and what a program was compiled as (`runtime`), jaxlib's C++
dispatch of a step call (`dispatch`), the placement of leaves on a device mesh (`sharding`) and Ctrl-C held
while a result is bound (`sigint`)."""
