#!/bin/bash
cd /app && echo "$(cat value.txt)" > out.txt
